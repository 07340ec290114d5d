"""What the event store's mixins use of :class:`~dressage.store.event_store.EventStore`, declared once.

``EventStore`` combines mixins (turns, leases, consumers, artifacts) that share its connection
handling and run lookup. The declarations below exist only for type checkers; at run time
:class:`StoreMembers` is an empty base class and ``EventStore`` provides every member.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from contextlib import AbstractContextManager

    from sqlalchemy import Connection
    from sqlalchemy.engine import Engine

    from dressage.store.artifacts import BlobStore
    from dressage.store.records import AppendResult, Run, Session


class StoreMembers:
    """Base of the store mixins; see the module docstring."""

    if TYPE_CHECKING:  # provided by EventStore
        engine: Engine
        blobs: BlobStore | None
        max_payload_bytes: int
        secrets: tuple[str, ...]

        @property
        def dialect(self) -> str: ...

        def get_run(self, run: str | Run) -> Run: ...
        def get_run_by_id(self, run_id: int) -> Run: ...
        def get_session(self, session_id: str) -> Session: ...
        def last_position(self, run: str | Run) -> int: ...
        def _read(self) -> AbstractContextManager[Connection]: ...
        def _write(self) -> AbstractContextManager[Connection]: ...
        def _retrying(self, fn: Callable[[Connection], Any], attempts: int = 3) -> Any: ...
        def _next_position(self, conn: Connection, run_id: int) -> int: ...
        def _append_event_tx(
            self,
            conn: Connection,
            run_id: int,
            kind: str,
            payload: Mapping[str, Any],
            *,
            key: str | None = None,
            session_id: str | None = None,
            content_hash: str | None = None,
        ) -> AppendResult: ...
