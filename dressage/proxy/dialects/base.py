"""What a dialect adapter is: request parsing, reply rendering and stream rendering for one API.

The shared turn path (:mod:`dressage.proxy.turns`) authenticates, reads the body, asks the
dialect for a :class:`~dressage.proxy.conversation.Conversation`, then plans, generates and
records without knowing which dialect asked. It hands the recorded turn back to the dialect,
which renders the reply (:meth:`Dialect.respond`) or, for a streamed request, turns the shared
events (reasoning/content text as it becomes stable, then the recorded reply) into its own
server-sent events through a :class:`StreamRenderer`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping

from starlette.requests import Request
from starlette.responses import JSONResponse

from dressage.errors import NotSupportedError
from dressage.proxy.conversation import Conversation
from dressage.proxy.reply_data import ReplyData
from dressage.proxy.sessions import SessionState
from dressage.tito.model_profile import ModelProfile
from dressage.tito.tool_calls import ParsedAssistant


def url_or_bearer_token(request: Request) -> str | None:
    """The session token: from the URL when present (it wins), else the bearer header."""
    token = request.path_params.get("token")
    if token:
        return str(token)
    auth = request.headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    return value.strip() or None if scheme.lower() == "bearer" else None


class StreamRenderer(ABC):
    """Turns one streamed turn's shared events into a dialect's server-sent events (bytes)."""

    @abstractmethod
    def start(self) -> list[bytes]:
        """The events before any text (a role chunk, ``message_start``, ``response.created``)."""

    @abstractmethod
    def delta(self, reasoning: str, content: str, ids: list[int], logprobs: list[float]) -> list[bytes]:
        """Newly stable reasoning and content text, and the ids (with logprobs) generated since."""

    def alternatives(self, top: list[list[tuple[int, float]]]) -> None:
        """The top ``(token_id, logprob)`` alternatives of the ids the next :meth:`delta` brings.

        Called before that delta when the request asked for top logprobs; dialects without them
        keep the default, which drops them.
        """
        return None

    @abstractmethod
    def finish(self, reply: ReplyData, parsed: ParsedAssistant, reasoning: str, content: str) -> list[bytes]:
        """The recorded turn: the held-back text tails, tool calls, the stop reason, usage, the end."""

    @abstractmethod
    def error(self, exc: BaseException, message: str) -> list[bytes]:
        """The events that end a stream that failed (the message is already redacted)."""


class Dialect(ABC):
    """One API dialect: parse into the shared conversation, render the recorded turn back."""

    name: str
    """``chat``, ``messages`` or ``responses`` (recorded on every turn)."""

    def __init__(self, profile: ModelProfile, model_name: str) -> None:
        self.profile = profile
        self.model_name = model_name

    def token(self, request: Request) -> str | None:
        """The session token the request carries."""
        return url_or_bearer_token(request)

    @abstractmethod
    def parse(
        self, raw: bytes, state: SessionState, default_sampling: Mapping[str, object] | None
    ) -> Conversation:
        """Validate a raw body into the shared conversation (:class:`RequestError` for anything wrong)."""

    @abstractmethod
    def respond(self, conv: Conversation, reply: ReplyData, parsed: ParsedAssistant) -> dict[str, object]:
        """The non-streamed reply body of a recorded turn."""

    @abstractmethod
    def renderer(self, conv: Conversation, rid: str, created: int, prompt_tokens: int) -> StreamRenderer:
        """A renderer for one streamed reply."""

    def renderers(
        self, conv: Conversation, rid: str, created: int, prompt_tokens: int
    ) -> list[StreamRenderer]:
        """One renderer per choice (``conv.n``), streamed one after the other; the last one ends the stream.

        Dialects without several choices per request never parse ``n > 1``; this default serves ``n == 1``.
        """
        if conv.n != 1:
            raise NotSupportedError(
                f"the {self.name} dialect has no several choices per request (n={conv.n})"
            )
        return [self.renderer(conv, rid, created, prompt_tokens)]

    @abstractmethod
    def error_response(self, exc: BaseException, secrets: Iterable[str]) -> JSONResponse:
        """An error in this dialect's error shape (the status from the one error table)."""

    def headers(self, reply: ReplyData) -> dict[str, str]:
        """Response headers a dialect adds to a recorded reply (none by default)."""
        return {}
