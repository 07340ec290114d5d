"""The TITO proxy: OpenAI-compatible chat completions, token-exact recording of every turn.

Agents talk OpenAI chat to it with one bearer token per session; it renders the conversation to
token ids itself (incremental tokenization, :mod:`dressage.tito`), calls the engine by ids
(SGLang's ``/generate``), and appends each turn to the event log before the agent sees the reply.
:class:`ProxyServer` is the entry point; :mod:`dressage.proxy.app` the ASGI app.
"""

from dressage.proxy.contract import FinalizedSession, Proxy, SessionHandle
from dressage.proxy.server import ProxyServer
from dressage.proxy.service import ProxyService

__all__ = ["FinalizedSession", "Proxy", "ProxyServer", "ProxyService", "SessionHandle"]
