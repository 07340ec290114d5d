"""paddock: sandboxes where agents run real tools, and the tools themselves.

Providers: ``bwrap`` (bubblewrap namespaces; the default), ``image`` (bwrap over an OCI image's
root filesystem), ``e2b`` (E2B cloud sandboxes),
``local`` (plain subprocesses, no isolation, for development). Get one with :func:`get_provider`.
"""

from __future__ import annotations

from dressage.errors import SandboxError
from dressage.paddock.base import ExecResult, FileInfo, Sandbox, SandboxProvider, SandboxSpec
from dressage.paddock.proxy_socket import serve_unix_socket_forwarder, serve_unix_socket_router
from dressage.paddock.tools import SandboxTools

PROVIDERS = ("bwrap", "image", "e2b", "local")
SOCKET_PROVIDERS = ("bwrap", "image")
"""Providers whose sandboxes without network reach the proxy through a Unix socket (``spec.proxy_socket``)."""


def get_provider(name: str = "bwrap", **kwargs: object) -> SandboxProvider:
    """Return a provider by name; ``kwargs`` go to its constructor (e.g. ``root_dir`` for bwrap)."""
    if name == "image":
        from dressage.paddock.image import ImageProvider

        return ImageProvider(**kwargs)  # type: ignore[arg-type]
    if name == "bwrap":
        from dressage.paddock.bwrap import BwrapProvider

        return BwrapProvider(**kwargs)  # type: ignore[arg-type]
    if name == "local":
        from dressage.paddock.local import LocalProvider

        return LocalProvider()
    if name == "e2b":
        from dressage.paddock.e2b import E2BProvider

        return E2BProvider(**kwargs)  # type: ignore[arg-type]
    raise SandboxError(f"unknown sandbox provider {name!r}: choose one of {', '.join(PROVIDERS)}")


async def create_sandbox(session_id: str, spec: SandboxSpec) -> Sandbox:
    """Shortcut: ``get_provider(spec.provider).create(session_id, spec)``."""
    return await get_provider(spec.provider).create(session_id, spec)


__all__ = [
    "PROVIDERS",
    "SOCKET_PROVIDERS",
    "ExecResult",
    "FileInfo",
    "Sandbox",
    "SandboxProvider",
    "SandboxSpec",
    "SandboxTools",
    "create_sandbox",
    "get_provider",
    "serve_unix_socket_forwarder",
    "serve_unix_socket_router",
]
