"""The scheduler of the CPU dev engine: one worker thread that owns the model.

Every model touch (prefill, decode, weight loading) happens on the worker thread, so HTTP
handlers never block on torch and a weight update is atomic with respect to generation. Active
requests advance round-robin, one token each per turn, each with its own KV cache. Control
operations (pause, continue, weight update) are queued as commands and run between tokens.

Each request reports through an ``emit(chunk, final)`` callback with SGLang-shaped response dicts
(cumulative ``output_ids``/``output_token_logprobs``, as SGLang streams by default).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import inspect
import logging
import threading
from collections.abc import Callable
from typing import Any, TypedDict, TypeVar

import numpy as np

from dressage.engines.grammar import GrammarState
from dressage.engines.protocol import PauseMode, encode_routed_experts
from dressage.engines.sampling import ResolvedSampling, apply_penalties, request_seed, sample_token
from dressage.engines.tiny_model import LoadedModel, RouterCapture, load_weights_from_disk
from dressage.errors import RequestError

T = TypeVar("T")

log = logging.getLogger(__name__)

Emit = Callable[[dict[str, object], bool], None]


@dataclasses.dataclass
class DevRequest:
    """One generation in flight: inputs, progress, and where to report it."""

    rid: str
    input_ids: list[int]
    sampling: ResolvedSampling
    return_logprob: bool
    return_routed_experts: bool
    routed_experts_start_len: int
    stream: bool
    emit: Emit
    top_logprobs_num: int = 0
    grammar: GrammarState | None = None
    output_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = dataclasses.field(default_factory=list)
    experts: list[np.ndarray] = dataclasses.field(default_factory=list)
    version_events: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    finish_reason: dict[str, object] | None = None
    abort_message: str | None = None
    cache: Any = None
    generator: Any = None


class DevScheduler:
    """Runs generations for a :class:`LoadedModel` on a background thread."""

    def __init__(self, loaded: LoadedModel, *, seed: int = 0, weight_version: str = "0") -> None:
        self.loaded = loaded
        self.seed = seed
        self.weight_version = weight_version
        self.capture = RouterCapture(loaded.model)
        params = inspect.signature(loaded.model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self._cond = threading.Condition()
        self._pending: list[DevRequest] = []
        self._active: list[DevRequest] = []
        # each command is a closure that runs its function and settles its future
        self._commands: list[Callable[[], None]] = []
        self._paused = False
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="dev-engine-scheduler", daemon=True)
        self._thread.start()

    # --- API for the HTTP layer (any thread) --------------------------------------------------

    def submit(self, request: DevRequest) -> None:
        """Queue a request; it starts at the next scheduler turn (or after a pause ends)."""
        with self._cond:
            if any(r.rid == request.rid for r in (*self._pending, *self._active)):
                raise RequestError(f"a request with rid {request.rid!r} is already running", param="rid")
            self._pending.append(request)
            self._cond.notify_all()

    def abort(
        self, rid: str | None = None, *, abort_all: bool = False, message: str = "Abort request"
    ) -> None:
        """Mark requests to end with ``finish_reason.type == "abort"`` at their next turn."""
        with self._cond:
            for req in (*self._pending, *self._active):
                if abort_all or req.rid == rid:
                    req.abort_message = message
            self._cond.notify_all()

    def run_command(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run ``fn`` on the scheduler thread between tokens; the future holds its result."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._cond:
            self._commands.append(lambda: self._run(fn, future))
            self._cond.notify_all()
        return future

    def pause(self, mode: PauseMode) -> concurrent.futures.Future[None]:
        """Stop generating. ``abort`` ends in-flight requests; other modes hold them in place."""

        def do() -> None:
            self._paused = True
            if mode == "abort":
                for req in (*self._pending, *self._active):
                    req.abort_message = "Abort by pause_generation"
                self._finish_aborted()

        return self.run_command(do)

    def continue_(self) -> concurrent.futures.Future[None]:
        """Resume generating (held requests continue with the weights now loaded)."""

        def do() -> None:
            self._paused = False

        return self.run_command(do)

    def update_weights(
        self, model_path: str, weight_version: str | None, abort_all: bool
    ) -> concurrent.futures.Future[tuple[int, int]]:
        """Load safetensors weights between tokens; the result is ``(tensors_loaded, num_held)``."""

        def do() -> tuple[int, int]:
            if abort_all:
                for req in (*self._pending, *self._active):
                    req.abort_message = "Abort by update_weights_from_disk"
                self._finish_aborted()
            loaded = load_weights_from_disk(self.loaded.model, model_path)
            self.loaded.model_path = model_path
            if weight_version is not None:
                self._set_version(weight_version)
            return loaded, len(self._active)

        return self.run_command(do)

    def set_weight_version(self, version: str) -> concurrent.futures.Future[None]:
        """Change the reported weight version without touching weights."""
        return self.run_command(lambda: self._set_version(version))

    @property
    def paused(self) -> bool:
        """Whether generation is paused."""
        return self._paused

    def stop(self) -> None:
        """End the worker thread (in-flight requests are aborted)."""
        self.abort(abort_all=True, message="engine shutting down")
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join(timeout=10)

    # --- scheduler thread ---------------------------------------------------------------------

    def _set_version(self, version: str) -> None:
        for req in self._active:
            if req.output_ids:
                req.version_events.append((self.weight_version, len(req.output_ids)))
        self.weight_version = version

    def _loop(self) -> None:
        import torch

        with torch.inference_mode():
            while True:
                with self._cond:
                    while not self._stopped and not self._commands and not self._any_aborted():
                        if not self._paused and self._has_work():
                            break
                        self._cond.wait()
                    if self._stopped:
                        self._finish_aborted()
                        return
                    commands, self._commands = self._commands, []
                for command in commands:
                    command()
                self._finish_aborted()
                with self._cond:
                    if self._paused:
                        continue
                    self._active.extend(self._pending)
                    self._pending.clear()
                for req in list(self._active):
                    self._step_guarded(req)

    def _has_work(self) -> bool:
        return bool(self._pending or self._active)

    def _any_aborted(self) -> bool:
        return any(r.abort_message is not None for r in (*self._pending, *self._active))

    @staticmethod
    def _run(fn: Callable[[], T], future: concurrent.futures.Future[T]) -> None:
        try:
            future.set_result(fn())
        except Exception as e:  # top-level of a command: hand any failure to the caller
            future.set_exception(e)

    def _finish_aborted(self) -> None:
        with self._cond:
            doomed = [r for r in (*self._pending, *self._active) if r.abort_message is not None]
            self._pending = [r for r in self._pending if r.abort_message is None]
            self._active = [r for r in self._active if r.abort_message is None]
        for req in doomed:
            req.finish_reason = {
                "type": "abort",
                "message": req.abort_message,
                "status_code": None,
                "err_type": None,
            }
            req.emit(self._chunk(req), True)

    def _step_guarded(self, req: DevRequest) -> None:
        try:
            self._step(req)
        except Exception as e:  # top-level of one request: fail it, keep serving the others
            log.exception("dev engine: a request failed")
            req.finish_reason = {
                "type": "abort",
                "message": f"engine error: {e}",
                "status_code": 500,
                "err_type": type(e).__name__,
            }
        if req.finish_reason is not None:
            with self._cond:
                if req in self._active:
                    self._active.remove(req)
            req.emit(self._chunk(req), True)
        elif req.stream:
            req.emit(self._chunk(req), False)

    def _step(self, req: DevRequest) -> None:
        import torch

        if req.sampling.max_new_tokens == 0:
            req.finish_reason = {"type": "length", "length": 0}
            return
        if req.generator is None:
            req.generator = torch.Generator().manual_seed(request_seed(self.seed, req.rid, req.sampling.seed))
            feed = req.input_ids
        else:
            feed = req.output_ids[-1:]
        self.capture.begin(req.experts if req.return_routed_experts else None)
        try:
            out = self.loaded.model(
                input_ids=torch.tensor([feed], dtype=torch.long),
                use_cache=True,
                logits_to_keep=1,
                **{self._cache_kwarg: req.cache},
            )
        finally:
            self.capture.end()
        req.cache = getattr(out, "past_key_values", None)
        logits_V = apply_penalties(out.logits[0, -1].float(), req.sampling, req.output_ids)
        if req.grammar is not None:
            req.grammar.mask(logits_V)
        sampled = sample_token(logits_V, req.sampling, req.generator, req.top_logprobs_num)
        req.output_ids.append(sampled.token)
        req.logprobs.append(sampled.logprob)
        if sampled.top is not None:
            req.top_logprobs.append(sampled.top)
        if req.grammar is not None:
            req.grammar.accept(sampled.token)
        req.finish_reason = self._check_finish(req, sampled.token)

    def _check_finish(self, req: DevRequest, token: int) -> dict[str, object] | None:
        stop_ids = set(req.sampling.stop_token_ids)
        if not req.sampling.ignore_eos:
            stop_ids.update(self.loaded.eos_token_ids)
        if token in stop_ids:
            return {"type": "stop", "matched": token}
        if req.sampling.stop_strs and self.loaded.tokenizer is not None:
            text = self.loaded.tokenizer.decode(req.output_ids)
            for stop in req.sampling.stop_strs:
                if stop in text:
                    return {"type": "stop", "matched": stop}
        if len(req.output_ids) >= req.sampling.max_new_tokens:
            return {"type": "length", "length": len(req.output_ids)}
        if len(req.input_ids) + len(req.output_ids) >= self.loaded.max_context:
            return {"type": "length", "length": len(req.output_ids)}
        if req.grammar is not None and req.grammar.terminated:
            return {"type": "stop", "matched": token}
        return None

    def _chunk(self, req: DevRequest) -> dict[str, object]:
        """The SGLang response dict for ``req`` so far (cumulative)."""
        n = len(req.output_ids)
        meta: dict[str, object] = {
            "id": req.rid,
            "finish_reason": req.finish_reason,
            "prompt_tokens": len(req.input_ids),
            "weight_version": self.weight_version,
            "completion_tokens": n,
            "cached_tokens": 0,
        }
        tokenizer = self.loaded.tokenizer
        if req.return_logprob:
            meta["output_token_logprobs"] = [
                [lp, tid, None] for lp, tid in zip(req.logprobs, req.output_ids, strict=True)
            ]
            if req.top_logprobs_num:
                meta["output_top_logprobs"] = [
                    [[lp, tid, None] for tid, lp in row] for row in req.top_logprobs
                ]
        if req.finish_reason is not None:
            meta["weight_versions"] = _version_spans(req.version_events, self.weight_version, n)
            if req.return_routed_experts and self.capture.supported:
                rows = (
                    np.concatenate(req.experts, axis=0)
                    if req.experts
                    else np.zeros((0, self.capture.num_layers, self.loaded.top_k or 0), dtype=np.int32)
                )
                meta["routed_experts"] = encode_routed_experts(rows[req.routed_experts_start_len :])
            req.cache = None  # free the KV cache of a finished request
        text = tokenizer.decode(req.output_ids, skip_special_tokens=True) if tokenizer is not None else ""
        return {"text": text, "output_ids": list(req.output_ids), "meta_info": meta}


class VersionSpan(TypedDict):
    """Output tokens ``[start, end)`` generated under one weight version."""

    version: str
    start: int
    end: int


def _version_spans(events: list[tuple[str, int]], current: str, n: int) -> list[VersionSpan]:
    """Weight-version spans over output tokens, as SGLang's ``compute_weight_version_spans``."""
    spans: list[VersionSpan] = []
    for version, end in [*events, (current, n)]:
        end = min(end, n)
        if spans and end <= spans[-1]["end"]:
            continue
        if spans and version == spans[-1]["version"]:
            spans[-1]["end"] = end
            continue
        spans.append({"version": version, "start": spans[-1]["end"] if spans else 0, "end": end})
    return spans


def check_prompt(loaded: LoadedModel, input_ids: list[int]) -> None:
    """Reject prompts the model cannot take (empty, ids outside the vocabulary, too long)."""
    if not input_ids:
        raise RequestError("input_ids is empty; send at least one token", param="input_ids")
    bad = [t for t in input_ids if not 0 <= t < loaded.vocab_size]
    if bad:
        raise RequestError(
            f"token ids {bad[:5]} are outside the vocabulary [0, {loaded.vocab_size})", param="input_ids"
        )
    if len(input_ids) >= loaded.max_context:
        raise RequestError(
            f"The input ({len(input_ids)} tokens) is longer than the model's context length ({loaded.max_context} tokens).",
            param="input_ids",
        )
