"""The process's one TLS context for outbound HTTP clients.

httpx builds a fresh ``ssl.SSLContext`` for every client it creates unless it is given one, and
building one loads the CA bundle: about 35-40 ms of CPU each time. A rollout worker creates an HTTP
client per episode (the agent's OpenAI client) and per engine of each proxy start, so the contexts
were a measurable share of a worker's CPU. Every client of ours (httpx's, and the ``httpx2`` client
under an agent's OpenAI client) takes :func:`tls_context` instead:
httpx's own default (certifi's bundle, or ``SSL_CERT_FILE``/``SSL_CERT_DIR`` as set when it is first
built), made once per process. Sharing one context between clients and threads is what ``ssl``
supports; the clients still verify certificates exactly as before.
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default TLS context, built on first use and shared by every client of this process."""
    return httpx.create_ssl_context()
