"""``export --format sft``: conversations in the chat-messages-with-tools form, beside the recorded ids.

The log stores token ids, not messages. Each training sample (one segment of a finished train
session, as the trainer materializes it) is decoded with the run's model profile and parsed back
into ``messages`` (system, user, assistant with ``reasoning_content`` and ``tool_calls``, tool
results) plus ``tools`` (JSON text) and ``chat_template_kwargs`` (``enable_thinking``): the
columns TRL's ``SFTTrainer`` reads. Beside them: ``token_ids`` (the recorded ids, exactly) and
``assistant_mask`` (1 on the tokens the trainer trains on).

The messages are then re-rendered with the profile's chat template (as the Arrow file gives them
back to a reader) and every row whose ids differ is flagged: ``exact`` false and a
``mismatch_reason``. A chat template closes every turn with ``<|im_end|>\\n`` while the model
stopped at ``<|im_end|>``; that newline, never generated nor trained, is the row's
``template_tail_ids``: an exact row re-renders to ``token_ids + template_tail_ids``. A last turn
cut by ``max_tokens`` has no ``<|im_end|>``: its tail is ``<|im_end|>\\n`` and ``truncated`` is
true (a trainer reading the messages would train on a turn end the model never wrote).

Parsing is implemented for the ChatML families (the ``qwen3.5`` and ``qwen3.6`` profiles); any
other profile is refused with a one-line error naming it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from dressage.errors import DressageError, StoreError
from dressage.tito.model_profile import ModelProfile
from dressage.tito.profiles import RUN_RECORD_KEY, build_profile
from dressage.training.samples import TrainSample

SFT_FILE = "sft.parquet"
_MARK = "\ue000"
_TOOL_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)


def sft_profile(run_config: Mapping[str, Any]) -> ModelProfile:
    """The model profile the run recorded (Qwen3.5 for runs without a record); refuses a profile
    whose token text this module cannot parse back into messages."""
    recorded = run_config.get(RUN_RECORD_KEY)
    name = str(recorded.get("model_profile")) if isinstance(recorded, Mapping) else "qwen3.5"
    if not name.startswith(("qwen3.5", "qwen3.6")):
        raise StoreError(
            f"--format sft cannot parse conversations of model profile {name!r} "
            "(implemented for qwen3.5 and qwen3.6); export --format parquet instead"
        )
    return build_profile(name)


class SftRows:
    """Builds ``sft.parquet`` rows for one run's samples with one model profile."""

    def __init__(self, profile: ModelProfile) -> None:
        """Parse and re-render with ``profile``."""
        self.profile = profile
        self.tail_ids = [int(x) for x in profile.tokenizer.encode("\n")]

    def row(self, sample: TrainSample, tools: list[dict[str, Any]] | None) -> dict[str, Any]:
        """The SFT row of one training sample (not yet checked: see :meth:`check`)."""
        ids = [int(x) for x in sample.tokens]
        prompt_len = len(ids) - sample.response_length
        stopped = bool(ids) and ids[-1] == self.profile.turn_end_id
        thinking = self._thinking(ids[:prompt_len])
        text = self.profile.tokenizer.decode(ids)
        try:
            messages = self._parse(text, tools, thinking)
            reason = None
        except (ValueError, DressageError) as e:
            messages, reason = [], f"unparsable: {e}"
        return {
            "session_id": sample.session_id,
            "segment_index": sample.segment_index,
            "thread_index": sample.thread_index,
            "reward": sample.reward,
            "messages": messages,
            "tools": None if tools is None else json.dumps(tools, ensure_ascii=False),
            "chat_template_kwargs": {"enable_thinking": thinking},
            "token_ids": ids,
            "assistant_mask": [0] * prompt_len + [int(x) for x in sample.loss_mask],
            "template_tail_ids": self.tail_ids if stopped else [self.profile.turn_end_id, *self.tail_ids],
            "truncated": not stopped,
            "exact": reason is None,
            "mismatch_reason": reason,
        }

    def check(self, row: dict[str, Any]) -> dict[str, Any]:
        """``row`` (as read back from Arrow) with ``exact``/``mismatch_reason`` set by re-rendering."""
        if not row["exact"]:
            return row
        tools = None if row["tools"] is None else json.loads(row["tools"])
        try:
            text = self.profile.render(
                row["messages"], tools, False, row["chat_template_kwargs"]["enable_thinking"]
            )
        except (DressageError, TypeError, ValueError, KeyError, AttributeError) as e:
            # odd messages the renderer rejects make a flagged row, not a failed export
            return row | {"exact": False, "mismatch_reason": f"does not render: {type(e).__name__}: {e}"}
        got = [int(x) for x in self.profile.tokenizer.encode(text)]
        want = row["token_ids"] + row["template_tail_ids"]
        if got == want:
            return row
        at = next(
            (i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want))
        )
        return row | {
            "exact": False,
            "mismatch_reason": f"re-rendered ids differ from the recorded ids at token {at} "
            f"({len(got)} rendered vs {len(want)} recorded + tail)",
        }

    def _thinking(self, prompt_ids: Sequence[int]) -> bool:
        """Whether the generation prompt opened thinking (its text ends the prompt)."""
        prompt = self.profile.tokenizer.decode(list(prompt_ids))
        return not prompt.endswith(self.profile.generation_prompt_suffix(False))

    def _parse(self, text: str, tools: list[dict[str, Any]] | None, thinking: bool) -> list[dict[str, Any]]:
        start, end = self.profile.turn_start_token, self.profile.turn_end_token
        if not text.startswith(start):
            raise ValueError(f"the ids do not start with {start}")
        messages: list[dict[str, Any]] = []
        for chunk in text[len(start) :].split(start):
            body = chunk.removesuffix("\n").removesuffix(end)
            role, _, content = body.partition("\n")
            if role == "system":
                messages += self._system(content, tools, thinking)
            elif role == "user" and content.startswith("<tool_response>"):
                messages += [{"role": "tool", "content": c} for c in _TOOL_RESPONSE.findall(content)]
            elif role == "user":
                messages.append({"role": "user", "content": content})
            elif role == "assistant":
                messages.append(self._assistant(content, tools, thinking))
            else:
                raise ValueError(f"unknown role {role[:20]!r}")
        return messages

    def _system(self, body: str, tools: list[dict[str, Any]] | None, thinking: bool) -> list[dict[str, Any]]:
        if not tools:
            return [{"role": "system", "content": body}]
        user = {"role": "user", "content": _MARK}
        system = self.profile.render([{"role": "system", "content": _MARK}, user], tools, False, thinking)
        prefix = system.split(_MARK)[0].removeprefix(self.profile.turn_start_token + "system\n")
        if body.startswith(prefix):
            return [{"role": "system", "content": body[len(prefix) :]}]
        bare = self.profile.render([user], tools, False, thinking)
        if bare.startswith(f"{self.profile.turn_start_token}system\n{body}{self.profile.turn_end_token}"):
            return []  # only the tools block: the conversation had no system message
        raise ValueError("the system turn does not hold the recorded tools")

    def _assistant(self, body: str, tools: list[dict[str, Any]] | None, thinking: bool) -> dict[str, Any]:
        # the body holds its own ``<think>`` opener (the generation prompt is part of the ids)
        parsed = self.profile.parse_assistant(body, tools, False)
        if parsed.failures:
            raise ValueError(f"tool call does not parse: {parsed.failures[0]}")
        msg = parsed.to_message()
        if msg["content"] is None:
            msg["content"] = ""
        for call in msg.get("tool_calls", []):
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
        return msg


def sft_schema(messages: pa.DataType) -> pa.Schema:
    """The schema of ``sft.parquet``; ``messages`` is inferred from the rows (Arrow unifies their
    structs), every other column is fixed."""
    ids = pa.list_(pa.int32())
    return pa.schema(
        [
            ("session_id", pa.string()),
            ("segment_index", pa.int32()),
            ("thread_index", pa.int32()),
            ("reward", pa.float64()),
            ("messages", messages),
            ("tools", pa.string()),
            ("chat_template_kwargs", pa.struct([("enable_thinking", pa.bool_())])),
            ("token_ids", ids),
            ("assistant_mask", ids),
            ("template_tail_ids", ids),
            ("truncated", pa.bool_()),
            ("exact", pa.bool_()),
            ("mismatch_reason", pa.string()),
        ],
        metadata={"dressage.schema": "sft-1"},
    )


def sft_table(rows: list[dict[str, Any]], checker: SftRows) -> pa.Table:
    """The checked Arrow table of ``rows`` (each re-rendered from its Arrow form)."""
    try:
        messages = pa.array([r["messages"] for r in rows]).type if rows else pa.list_(pa.null())
        schema = sft_schema(messages)
        table = pa.Table.from_pylist(rows, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise StoreError(f"cannot write the SFT messages as Parquet: {e}") from e
    checked = [checker.check(r) for r in table.to_pylist()]
    return pa.Table.from_pylist(checked, schema=schema)
