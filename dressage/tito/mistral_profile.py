"""The Mistral family: Mistral NeMo (Tekken vocabulary, instruct format v3) as ``mistral-common`` encodes it.

Mistral publishes no jinja template as its reference: its own encoder (``mistral-common``'s
``MistralTokenizer.encode_chat_completion``) is. This renderer writes the same conversation as
text with the control tokens spelt out, which the Tekken vocabulary (:mod:`dressage.tito.tekken_vocab`)
encodes to exactly the encoder's ids (tests compare with ``mistral-common`` itself). What the v3
encoder does, reproduced here:

* ``<s>``, then per message: user ``[INST]text[/INST]``; assistant ``text</s>`` (trailing spaces
  stripped) or ``[TOOL_CALLS][{"name", "arguments", "id"}]</s>``; tool
  ``[TOOL_RESULTS]{"content", "call_id"}[/TOOL_RESULTS]`` (JSON content is re-serialised);
* all system messages are joined with ``\\n\\n`` and prefixed to the **last** user message, and
  the tool list (``[AVAILABLE_TOOLS]...[/AVAILABLE_TOOLS]``) goes right before it: a new user turn
  therefore rewrites the previous one (boundary ``template_prefix_mismatch``), while an agent's
  tool loop under one user turn appends;
* consecutive user (or assistant) messages are merged (``\\n\\n``); a conversation that does not
  start with a user message gets an empty one first;
* there is no generation prompt and no reasoning; the model ends every turn with ``</s>``.

Control-token text inside message content is encoded as the control token here (as the jinja
families do); ``mistral-common`` encodes it as plain text. Requests the encoder refuses (content
and tool calls in one assistant turn, a tool result without ``tool_call_id``, a system message
after an assistant or tool turn, a tool result right after a user turn) are refused.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dressage.errors import TemplateError
from dressage.tito.chat_template import RenderedConversation
from dressage.tito.model_profile import ModelProfile, PromptRenderer
from dressage.tito.render_cache import PromptText
from dressage.tito.tokenizer import Tokenizer
from dressage.tito.tool_calls import ParsedAssistant, ToolCallFailure

TEKKEN_FILE = "tekken_240718.json"
BOS, EOS = "<s>", "</s>"
INST, INST_END = "[INST]", "[/INST]"
TOOLS_BEGIN, TOOLS_END = "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]"
RESULTS_BEGIN, RESULTS_END = "[TOOL_RESULTS]", "[/TOOL_RESULTS]"
TOOL_CALLS = "[TOOL_CALLS]"
_JOIN = "\n\n"
_ID_CHARS = string.ascii_letters + string.digits
_ID = re.compile(r"^[a-zA-Z0-9]{9}$")
_REFUSED_ORDER = {("assistant", "system"), ("tool", "system"), ("user", "tool"), ("system", "tool")}
"""Role orders ``mistral-common``'s validator refuses."""


def _plain(value: Any) -> Any:
    if hasattr(value, "model_dump") and callable(value.model_dump):
        return value.model_dump()
    return value


def _text(content: Any) -> str:
    """Content as one string: text parts joined with ``\\n\\n`` (the normaliser's chunk join)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list | tuple):
        parts = []
        for part in content:
            if (
                not isinstance(part, Mapping)
                or part.get("type", "text") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise TemplateError("mistral-nemo: only text content parts are supported")
            if part["text"]:
                parts.append(part["text"])
        return _JOIN.join(parts)
    raise TemplateError(f"mistral-nemo: message content must be a string, got {type(content).__name__}")


def _json_value(text: str) -> Any:
    """What the encoder embeds for a JSON-ish string: the parsed value, else the text itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _normalized_json(text: str | None) -> str:
    """The normaliser's JSON clean-up (``{}`` for empty, re-serialised when it parses)."""
    if not text:
        return "{}"
    try:
        return json.dumps(json.loads(text), ensure_ascii=False)
    except json.JSONDecodeError:
        return text


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _merge(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Merge runs of user / assistant messages (system messages end a run and are dropped)."""
    out: list[dict[str, Any]] = []
    prev_role: str | None = None
    for m in messages:
        role = m["role"]
        if role in ("user", "assistant") and role == prev_role:
            last = out[-1]
            joined = [t for t in (last.get("content") or "", m.get("content") or "") if t]
            last["content"] = _JOIN.join(joined)
            last["tool_calls"] = (last.get("tool_calls") or []) + (m.get("tool_calls") or [])
        elif role != "system":
            out.append(dict(m))
        prev_role = role
    if not out or out[0]["role"] != "user":
        out.insert(0, {"role": "user", "content": ""})
    return out


def _normalize_one(raw: Any, prev: str | None) -> dict[str, Any]:
    """One OpenAI message in the encoder's shape (``prev``: the previous message's role)."""
    m = _plain(raw)
    if not isinstance(m, Mapping):
        raise TemplateError(f"a chat message must be an object, got {type(m).__name__}")
    role = "system" if m.get("role") == "developer" else m.get("role")
    if role not in ("system", "user", "assistant", "tool"):
        raise TemplateError(f"mistral-nemo: unexpected message role {role!r}")
    if (prev, role) in _REFUSED_ORDER:
        raise TemplateError(f"mistral-nemo: a {role} message cannot follow a {prev} message")
    msg: dict[str, Any] = {"role": role, "content": _text(m.get("content"))}
    if role == "assistant" and m.get("tool_calls"):
        if msg["content"]:
            raise TemplateError("mistral-nemo: an assistant turn cannot have both content and tool calls")
        msg["tool_calls"] = [_plain(c) for c in m["tool_calls"]]
    if role == "tool":
        if not m.get("tool_call_id"):
            raise TemplateError("mistral-nemo: a tool result needs its 'tool_call_id'")
        msg["tool_call_id"] = m["tool_call_id"]
    return msg


def _normalize(messages: Sequence[Any]) -> tuple[list[dict[str, Any]], str | None]:
    """OpenAI messages -> (merged messages, system prompt)."""
    norm: list[dict[str, Any]] = []
    prev: str | None = None
    for raw in messages:
        msg = _normalize_one(raw, prev)
        prev = msg["role"]
        norm.append(msg)
    systems = [m["content"] for m in norm if m["role"] == "system" and m["content"]]
    return _merge(norm), (_JOIN.join(systems) if systems else None)


def _tools_json(tools: Sequence[Any]) -> str:
    """The tool list as the encoder writes it (``description`` ``""`` and ``parameters`` ``{}`` by default)."""
    out = []
    for raw in tools:
        tool = _plain(raw)
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise TemplateError("mistral-nemo: a tool needs 'function.name'")
        function = {
            "name": fn["name"],
            "description": fn.get("description") or "",
            "parameters": fn.get("parameters") or {},
        }
        out.append({"type": tool.get("type", "function"), "function": function})
    return _dumps(out)


def _call(call: Any) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise TemplateError("mistral-nemo: a tool call needs 'function.name'")
    args = fn.get("arguments")
    args_text = args if isinstance(args, str) or args is None else _dumps(args)
    out = {"name": fn["name"], "arguments": _json_value(_normalized_json(args_text))}
    if call.get("id") and call["id"] != "null":
        out["id"] = call["id"]
    return out


def _render_message(msg: Mapping[str, Any], is_last_user: bool, system: str | None, tools: Any) -> str:
    role = msg["role"]
    if role == "user":
        head = f"{TOOLS_BEGIN}{_tools_json(tools)}{TOOLS_END}" if is_last_user and tools else ""
        content = msg["content"]
        if is_last_user and system:
            content = system + _JOIN + content
        return f"{head}{INST}{content}{INST_END}"
    if role == "assistant":
        if msg.get("tool_calls"):
            return TOOL_CALLS + _dumps([_call(c) for c in msg["tool_calls"]]) + EOS
        if not msg["content"]:
            raise TemplateError("mistral-nemo: an assistant turn needs content or tool calls")
        return msg["content"].rstrip(" ") + EOS
    result = {"content": _json_value(_normalized_json(msg["content"])), "call_id": msg["tool_call_id"]}
    return RESULTS_BEGIN + _dumps(result) + RESULTS_END


def render_mistral_parts(messages: Sequence[Any], tools: Sequence[Any] | None) -> RenderedConversation:
    """Render a request as ``mistral-common``'s v3 encoder lays it out (header ``<s>``, no suffix)."""
    if not messages:
        raise TemplateError("No messages provided.")
    msgs, system = _normalize(messages)
    last_user = max(i for i, m in enumerate(msgs) if m["role"] == "user")
    parts = tuple(_render_message(m, i == last_user, system, tools) for i, m in enumerate(msgs))
    return RenderedConversation(BOS, parts, "", last_user)


def _trusted(raw: Any) -> bool:
    """Whether ``==`` on this message implies an equal rendering (string content and arguments)."""
    if type(raw) is not dict or not isinstance(raw.get("content"), str | None):
        return False
    for call in raw.get("tool_calls") or ():
        fn = call.get("function") if type(call) is dict else None
        if type(fn) is not dict or not isinstance(fn.get("arguments"), str):
            return False
    return True


@dataclass
class _Rendered:
    """One cached rendering: copies of the raw messages and tools, its text, its last role."""

    raw: list[Any]
    tools: Any
    text: str
    last_role: str


def _refuse_thinking_switch(enable_thinking: bool | None) -> None:
    """Mistral-Nemo's template has no thinking switch: a request that sets one is refused."""
    if enable_thinking is not None:
        raise TemplateError(
            "mistral-nemo has no thinking switch; leave chat_template_kwargs.enable_thinking unset"
        )


class MistralPromptRenderer:
    """Per-session renderer that appends the pieces of new assistant / tool messages (O(new)).

    The v3 layout only changes before the last user message when a user or system message
    arrives; an agent's tool loop adds assistant and tool messages after it, whose pieces do
    not depend on anything before them except a merge with a preceding assistant turn. So a
    request that extends a cached one (``==`` on the messages, a C-speed walk) by such messages
    only renders those; anything else is rendered in full.
    """

    def __init__(self, max_entries: int = 4) -> None:
        """Keep up to ``max_entries`` renderings (main agent, subagents, branches)."""
        self.max_entries = max_entries
        self._entries: list[_Rendered] = []
        self.reused = 0
        """Messages reused by the last :meth:`render` (for tests and profiling)."""

    def render(
        self, messages: Sequence[Any], tools: Sequence[Any] | None, enable_thinking: bool | None
    ) -> PromptText:
        """The prompt text (equal to :func:`render_mistral_parts`' text)."""
        _refuse_thinking_switch(enable_thinking)
        msgs = messages if isinstance(messages, list) else list(messages)
        for entry in self._entries:
            text = self._extend(entry, msgs, tools)
            if text is not None:
                self.reused = len(entry.raw)
                self._store(entry, msgs, tools, text)
                return PromptText(text, len(BOS))
        self.reused = 0
        text = render_mistral_parts(msgs, tools).text
        self._store(None, msgs, tools, text)
        return PromptText(text, len(BOS))

    def _extend(self, entry: _Rendered, msgs: list[Any], tools: Any) -> str | None:
        """The text of ``msgs`` built on ``entry``, or None when the fast path does not apply."""
        k = len(entry.raw)
        if len(msgs) <= k or entry.tools != tools or msgs[:k] != entry.raw:
            return None
        pieces, prev = [], entry.last_role
        for raw in msgs[k:]:
            if not _trusted(raw) or raw.get("role") not in ("assistant", "tool"):
                return None
            msg = _normalize_one(raw, prev)
            if msg["role"] == "assistant" and prev == "assistant":
                return None  # merges with the previous turn: render in full
            pieces.append(_render_message(msg, False, None, None))
            prev = msg["role"]
        return entry.text + "".join(pieces)

    def _store(self, entry: _Rendered | None, msgs: list[Any], tools: Any, text: str) -> None:
        if not all(_trusted(m) for m in msgs[len(entry.raw) if entry else 0 :]):
            return
        k = len(entry.raw) if entry else 0
        raw = [*(entry.raw if entry else []), *copy.deepcopy(msgs[k:])]
        last = "system" if msgs[-1].get("role") == "developer" else msgs[-1].get("role")
        if entry is not None:
            self._entries.remove(entry)  # a prefix of the new rendering: dominated
        self._entries.insert(0, _Rendered(raw, copy.deepcopy(tools), text, str(last)))
        del self._entries[self.max_entries :]


def _mistral_id(seed: str, index: int) -> str:
    """A deterministic 9-character alphanumeric tool-call id (Mistral's id format)."""
    digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    return "".join(_ID_CHARS[b % len(_ID_CHARS)] for b in digest[:9])


def parse_mistral_output(text: str, seed: str | None = None) -> ParsedAssistant:
    """Content, or the ``[TOOL_CALLS]`` JSON list, of generated text (never raises)."""
    start = text.find(TOOL_CALLS)
    if start < 0:
        return ParsedAssistant(content=text)
    seed = seed if seed is not None else hashlib.sha256(text.encode()).hexdigest()[:16]
    body = text[start + len(TOOL_CALLS) :]
    try:
        items = json.loads(body)
        if not isinstance(items, list) or not items:
            raise ValueError("not a list of calls")
        calls = []
        for i, item in enumerate(items):
            if not isinstance(item, dict) or not isinstance(item.get("name"), str) or "arguments" not in item:
                raise ValueError("a call needs 'name' and 'arguments'")
            call_id = item.get("id") if isinstance(item.get("id"), str) and _ID.match(item["id"]) else None
            calls.append(
                {
                    "id": call_id or _mistral_id(seed, i),
                    "type": "function",
                    "function": {"name": item["name"], "arguments": _dumps(item["arguments"])},
                }
            )
    except ValueError:
        return ParsedAssistant(content=text, failures=[ToolCallFailure("malformed_parameters", text[start:])])
    return ParsedAssistant(content=text[:start].strip(), tool_calls=calls)


class MistralNemoProfile(ModelProfile):
    """Mistral NeMo instruct (Tekken ``tekken_240718.json``, encoder v3; 128k context)."""

    name = "mistral-nemo"
    turn_start_token = INST
    turn_end_token = EOS
    tool_call_marker = TOOL_CALLS

    def load_tokenizer(self) -> Tokenizer:
        """The Tekken vocabulary of ``mistral-common`` (built and cached)."""
        from dressage.tito.tekken_vocab import tekken_tokenizer_json

        return Tokenizer.shared(tekken_tokenizer_json(TEKKEN_FILE), name="mistral-nemo")

    @property
    def template_hash(self) -> str:
        """sha256 of the Tekken file: with the encoder version it fixes the prompt layout."""
        from dressage.tito.tekken_vocab import tekken_file

        return hashlib.sha256(tekken_file(TEKKEN_FILE).read_bytes()).hexdigest()

    def first_turn_end(self, text: str, header_len: int) -> int:
        """The first user turn ends with ``[/INST]``."""
        end = text.find(INST_END, header_len)
        return end + len(INST_END) if end >= 0 else -1

    def render_parts(
        self,
        messages: Sequence[Any],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool | None = None,
    ) -> RenderedConversation:
        """Render (Mistral has no generation prompt; a thinking switch is refused)."""
        _refuse_thinking_switch(enable_thinking)
        return render_mistral_parts(messages, tools)

    def prompt_renderer(self) -> PromptRenderer:
        """A :class:`MistralPromptRenderer`: a tool loop renders only the new messages."""
        return MistralPromptRenderer()

    def generation_prompt_suffix(self, enable_thinking: bool | None = None) -> str:
        return ""

    def forced_tool_call_prefix(self, name: str, enable_thinking: bool | None = None) -> str:
        """``[TOOL_CALLS][{"name": "NAME", "arguments": `` (the encoder's key order; ``name`` ``""``:
        up to the name's opening quote)."""
        _refuse_thinking_switch(enable_thinking)
        return TOOL_CALLS + '[{"name": "' + (f'{name}", "arguments": ' if name else "")

    def parse_assistant(
        self,
        text: str,
        tools: Sequence[Mapping[str, Any]] | None = None,
        enable_thinking: bool | None = None,
        seed: str | None = None,
    ) -> ParsedAssistant:
        return parse_mistral_output(text, seed)
