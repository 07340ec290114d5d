"""SGLang's native HTTP protocol, as typed models.

Pinned to **SGLang 0.5.23** (PyPI wheel ``sglang-0.5.23-cp311``; ``sglang/_version.py`` carries no
commit id), read from ``sglang/srt/managers/io_struct.py``, ``sglang/srt/entrypoints/http_server.py``,
``sglang/srt/managers/tokenizer_manager.py``, ``sglang/srt/sampling/sampling_params.py``,
``sglang/srt/layers/sampler.py`` and ``sglang/srt/managers/schedule_batch.py``. Only the fields
Dressage uses are modelled; responses keep unknown fields (``extra="allow"``) so a newer server
does not break parsing.

Facts pinned from that source:

* ``POST /generate`` takes ``GenerateReqInput``: ``rid``, ``input_ids`` (or ``text``),
  ``sampling_params`` (dict), ``return_logprob``, ``logprob_start_len`` (default -1: output only),
  ``stream``, ``return_routed_experts``, ``routed_experts_start_len`` (default 0).
* The response is ``{"text", "output_ids", "meta_info"}``. ``meta_info`` has ``id`` (the rid),
  ``finish_reason``, ``prompt_tokens``, ``completion_tokens``, ``cached_tokens``, ``weight_version``,
  on finish ``weight_versions`` (spans ``{version, start, end}`` over output tokens), with
  ``return_logprob`` ``output_token_logprobs`` (``[logprob, token_id, text_or_null]`` per token) and
  with ``return_routed_experts`` ``routed_experts``.
* ``finish_reason`` is ``{"type": "stop", "matched": <token id int | stop str>}``,
  ``{"type": "length", "length": n}`` or ``{"type": "abort", "message", "status_code", "err_type"}``;
  ``null`` while unfinished. An abort through ``/abort_request`` has ``status_code`` null and the
  response is a normal 200 carrying the partial output.
* ``output_ids`` include the matched stop token; ``no_stop_trim`` only affects ``text``.
* Streaming: SSE lines ``data: {json}\\n\\n`` then ``data: [DONE]\\n\\n``. By default
  (server flag ``--incremental-streaming-output`` off) every chunk is **cumulative**: ``output_ids``
  and ``meta_info.output_token_logprobs`` hold everything generated so far. With the flag on both
  are per-chunk deltas. ``completion_tokens`` is always the running total, which tells the two apart.
  ``routed_experts`` and ``weight_versions`` arrive only on the finishing chunk.
* ``routed_experts`` is base64 of a C-order int32 array of shape
  ``[prompt_tokens + completion_tokens - 1 - routed_experts_start_len, num_layers, top_k]``
  (the last sampled token is never fed through the model). The server needs
  ``--enable-return-routed-experts``.
* Sampling params (``SamplingParams``): ``max_new_tokens`` (128), ``stop``, ``stop_token_ids``,
  ``temperature`` (1.0), ``top_p`` (1.0), ``top_k`` (-1 = all), ``min_p``, ``ignore_eos``,
  ``skip_special_tokens`` (True), ``no_stop_trim`` (False), ``sampling_seed`` (the seed's real name).
  ``temperature < 1e-6`` is normalised to ``temperature=1, top_k=1`` (greedy).
* More sampling params: ``frequency_penalty`` / ``presence_penalty`` (0.0, in [-2, 2]) and
  ``repetition_penalty`` (1.0, in (0, 2]) count **output tokens only** (``penaltylib``: additive
  ``logits -= freq * count + presence * (count > 0)``, then scaling: a seen token's logit is
  multiplied by the penalty when negative, divided when positive); they apply before the grammar
  mask and temperature. ``json_schema`` (a JSON string; ``"$$ANY$$"`` = any JSON), ``regex`` and
  ``ebnf`` select constrained decoding (at most one; ``n`` is parallel sampling, which Dressage
  does not send: the proxy issues one request per choice).
* ``top_logprobs_num`` (request field, with ``return_logprob``) adds ``meta_info.output_top_logprobs``:
  per output token a list of ``[logprob, token_id, text_or_null]``, best first, from the same
  distribution as ``output_token_logprobs``; cumulative while streaming like the latter.
* ``require_reasoning`` (request field): with a reasoning parser on the server, the grammar is
  deferred until the output has closed its thinking block.
* Returned logprobs (default, ``SGLANG_RETURN_ORIGINAL_LOGPROB`` unset): greedy ⇒
  ``log_softmax(logits)``; sampling ⇒ ``log(softmax(logits / temperature))`` over the full
  vocabulary, i.e. after temperature but before top-k/top-p truncation.
* Admin: ``POST /abort_request`` ``{rid, abort_all}`` → 200 empty; ``POST /pause_generation``
  ``{mode: "abort" | "retract" | "in_place"}`` (default ``abort``) → ``{"message", "status": "ok"}``;
  ``POST /continue_generation`` ``{torch_empty_cache}``; ``POST /update_weights_from_disk``
  ``{model_path, load_format, abort_all_requests, weight_version, flush_cache, ...}`` →
  ``{success, message, num_paused_requests}`` (400 when not successful);
  ``POST /update_weight_version`` ``{new_version, abort_all_requests}``; ``GET /model_info``
  (``model_path``, ``weight_version``, ``is_generation``, ...); ``GET /health`` (200 when up).
  There is no ``/get_weight_version`` route in 0.5.23: read ``weight_version`` from ``/model_info``.
* Errors: ``{"error": {"message": ...}}`` with status 400 for invalid requests.
"""

from __future__ import annotations

import base64
import json
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

SGLANG_VERSION = "0.5.23"
"""The SGLang release this module was checked against."""

GREEDY_EPS = 1e-6
"""SGLang treats ``0 <= temperature < GREEDY_EPS`` as greedy (``top_k = 1``)."""

SSE_DONE = "[DONE]"


class _Lenient(BaseModel):
    """Base for models parsed from a server: unknown fields are kept, not rejected."""

    model_config = ConfigDict(extra="allow")


class SamplingParams(BaseModel):
    """The subset of SGLang's ``SamplingParams`` Dressage sends, with SGLang's names and defaults.

    ``None`` means "server default" and is left out of the request body.
    """

    model_config = ConfigDict(extra="allow")

    max_new_tokens: int | None = Field(default=128, ge=0)
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = None
    min_p: float | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    no_stop_trim: bool | None = None
    sampling_seed: int | None = None
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=2.0)
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None

    def to_body(self) -> dict[str, object]:
        """The JSON object to send as ``sampling_params`` (unset fields omitted)."""
        return self.model_dump(exclude_none=True)


class GenerateRequest(BaseModel):
    """Body of ``POST /generate`` (single request; batches are not modelled)."""

    model_config = ConfigDict(extra="allow")

    rid: str | None = None
    input_ids: list[int] | None = None
    text: str | None = None
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    return_logprob: bool = False
    logprob_start_len: int = -1
    return_text_in_logprobs: bool = False
    top_logprobs_num: int | None = Field(default=None, ge=0)
    require_reasoning: bool | None = None
    stream: bool = False
    return_routed_experts: bool = False
    routed_experts_start_len: int = Field(default=0, ge=0)

    def to_body(self) -> dict[str, object]:
        """The JSON body, with unset optional fields omitted."""
        body = self.model_dump(exclude_none=True, exclude={"sampling_params"})
        body["sampling_params"] = self.sampling_params.to_body()
        return body


class FinishReason(_Lenient):
    """``meta_info.finish_reason``: why generation ended."""

    type: Literal["stop", "length", "abort"]
    matched: int | str | None = None
    length: int | None = None
    message: str | None = None
    status_code: int | None = None
    err_type: str | None = None


class WeightVersionSpan(_Lenient):
    """Output tokens ``[start, end)`` were generated with weights ``version``."""

    version: str
    start: int
    end: int


def policy_version(weight_version: str | None, fallback: int) -> int:
    """The log's policy version (an integer) of an engine's ``weight_version`` (a string).

    The one conversion point between the two: engines report and take weight versions as strings
    (SGLang), the log and the trainer count policy versions as integers. ``fallback`` when the
    engine reports none or a non-numeric one.
    """
    try:
        return int(weight_version) if weight_version is not None else fallback
    except ValueError:
        return fallback


def engine_weight_version(policy_version: int | str) -> str:
    """The engine's ``weight_version`` string of a policy version (the inverse of :func:`policy_version`)."""
    return str(policy_version)


class MetaInfo(_Lenient):
    """``meta_info`` of a ``/generate`` response or stream chunk."""

    id: str
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    weight_version: str | None = None
    weight_versions: list[WeightVersionSpan] | None = None
    output_token_logprobs: list[tuple[float | None, int, str | None]] | None = None
    output_top_logprobs: list[list[tuple[float | None, int, str | None]] | None] | None = None
    routed_experts: str | None = None


class GenerateResponse(_Lenient):
    """A ``/generate`` response (or one SSE chunk of a streamed one)."""

    text: str | None = None
    output_ids: list[int] = Field(default_factory=list)
    meta_info: MetaInfo


class AbortRequest(BaseModel):
    """Body of ``POST /abort_request``."""

    rid: str | None = None
    abort_all: bool = False


PauseMode = Literal["abort", "retract", "in_place"]


class PauseGenerationRequest(BaseModel):
    """Body of ``POST /pause_generation``.

    ``abort`` ends in-flight requests with ``finish_reason.type == "abort"`` and their partial
    output; ``retract``/``in_place`` hold them and resume them on ``/continue_generation``.
    """

    mode: PauseMode = "abort"


class ContinueGenerationRequest(BaseModel):
    """Body of ``POST /continue_generation``."""

    torch_empty_cache: bool = True


class UpdateWeightsFromDiskRequest(BaseModel):
    """Body of ``POST /update_weights_from_disk``."""

    model_config = ConfigDict(extra="allow")

    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    flush_cache: bool = True


class UpdateWeightsFromDiskResponse(_Lenient):
    """Answer of ``POST /update_weights_from_disk``."""

    success: bool
    message: str = ""
    num_paused_requests: int = 0


class ModelInfo(_Lenient):
    """Answer of ``GET /model_info``.

    SGLang's fields plus optional ones the Dressage dev engine adds (``vocab_size``,
    ``num_layers``, ``num_experts``, ``top_k``, ``routed_experts_supported``).
    """

    model_path: str
    weight_version: str | None = None
    is_generation: bool = True
    model_type: str | None = None
    vocab_size: int | None = None
    num_layers: int | None = None
    num_experts: int | None = None
    top_k: int | None = None
    routed_experts_supported: bool | None = None


def encode_routed_experts(experts: np.ndarray) -> str:
    """Base64 of a ``[n, layers, top_k]`` array as C-order int32 bytes, as SGLang sends it."""
    return base64.b64encode(np.ascontiguousarray(experts, dtype=np.int32).tobytes()).decode("ascii")


def decode_routed_experts(data: str, num_layers: int, top_k: int) -> np.ndarray:
    """Decode SGLang's base64 ``routed_experts`` into int32 ``[n, num_layers, top_k]``.

    The wire format carries no shape, so the caller supplies ``num_layers`` and ``top_k`` (from
    the model config or ``/model_info``); a byte count that does not fit raises ``ValueError``.
    """
    flat = np.frombuffer(base64.b64decode(data), dtype=np.int32)
    per_row = num_layers * top_k
    if per_row <= 0 or flat.size % per_row:
        raise ValueError(
            f"routed_experts holds {flat.size} int32 values, not a multiple of {num_layers}x{top_k}"
        )
    return flat.reshape(-1, num_layers, top_k).copy()


def sse_event(payload: dict[str, object] | str) -> bytes:
    """One server-sent event line as SGLang writes it: ``data: <json>\\n\\n``."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()
