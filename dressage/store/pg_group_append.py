"""Group append on PostgreSQL: the turns that arrive together share one transaction and one flush.

Every append of a run bumps the run's counter row (dense, commit-ordered positions: the log's
rule 2), and that row stays locked until the commit's WAL flush (rule 4), so separate appends of
one run queue behind each other's flush: one run took at most 1 / (statement + flush) appends a
second, whatever the machine. Here the appends that one event loop (one proxy process) is asked to
make while an earlier one is being written are sent together, as one transaction in one round trip
(libpq pipeline mode): ``BEGIN``, a statement that takes every session row of the group ``FOR
SHARE`` in id order, the append statement once per turn (sorted by run, so counter rows are taken
in one order everywhere), ``COMMIT``. N turns then cost one flush and one counter row lock instead of
N, positions stay dense and in commit order, and each caller still gets its reply only after the
commit is durable.

A turn that arrives when nothing is being written goes alone, as the single autocommit statement
(no added latency). A group that fails (a re-sent key, a taken turn index, a broken connection) is
rolled back whole, and its turns are answered ``None``: the caller then appends each on its own,
which records it or explains why not. The idempotency key makes that repeat safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial

import psycopg
from psycopg import pq
from psycopg.generators import execute, fetch_many, pipeline_communicate, send

log = logging.getLogger(__name__)

MAX_GROUP = 64
"""At most this many turns go into one transaction (a bigger queue is written in several)."""

LOCK_SESSIONS_SQL = "SELECT id FROM sessions WHERE id = ANY($1::text[]) ORDER BY id FOR SHARE"
"""Take a group's session rows before any counter row, in one order (as every single append and
every session status change does: session row first, then the counter)."""


class GroupAppendItem:
    """One turn waiting for a group: its run, its append statement's wire values, its answer."""

    __slots__ = ("future", "run_id", "session_id", "values")

    def __init__(
        self, run_id: int, session_id: str, values: list[bytes | None], future: asyncio.Future[int | None]
    ) -> None:
        self.run_id = run_id
        self.session_id = session_id
        self.values = values
        self.future = future


def text_array(items: list[str]) -> bytes:
    """A PostgreSQL ``text[]`` literal in text format (every element quoted and escaped)."""
    quoted = ('"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"' for s in items)
    return ("{" + ",".join(quoted) + "}").encode()


def group_commands(
    pgconn: pq.abc.PGconn, items: list[GroupAppendItem], statement: bytes, formats: list[int]
) -> deque[Callable[[], None]]:
    """The pipeline of one group: BEGIN, the session locks, one append per item, COMMIT, sync."""
    commands: deque[Callable[[], None]] = deque()
    commands.append(partial(pgconn.send_query_params, b"BEGIN", None))
    sessions = text_array(sorted({item.session_id for item in items}))
    commands.append(partial(pgconn.send_query_params, LOCK_SESSIONS_SQL.encode(), [sessions]))
    for item in items:
        commands.append(partial(pgconn.send_query_prepared, statement, item.values, formats))
    commands.append(partial(pgconn.send_query_params, b"COMMIT", None))
    commands.append(pgconn.pipeline_sync)
    return commands


async def _communicate(
    conn: psycopg.AsyncConnection[object], commands: deque[Callable[[], None]]
) -> list[list[pq.abc.PGresult]]:
    """Send a pipeline's commands and read every result up to its sync (one list per command)."""
    pgconn = conn.pgconn
    expected = len(commands)
    results = [r for r in await conn.wait(pipeline_communicate(pgconn, commands)) if r]
    await conn.wait(send(pgconn))
    while len(results) < expected:
        fetched = await conn.wait(fetch_many(pgconn))
        if fetched:
            results.append(fetched)
        elif pgconn.status == pq.ConnStatus.BAD:
            break
    return results


async def run_group(
    conn: psycopg.AsyncConnection[object],
    items: list[GroupAppendItem],
    statement: bytes,
    formats: list[int],
) -> list[int | None] | None:
    """Write ``items`` in one pipelined transaction on ``conn`` (autocommit, statement prepared).

    Returns each item's new position (None where its statement recorded nothing: a closed or
    foreign session), or None when the group failed and was rolled back (nothing recorded).
    A broken connection raises :class:`psycopg.OperationalError`.
    """
    pgconn = conn.pgconn
    pgconn.enter_pipeline_mode()
    try:
        results = await _communicate(conn, group_commands(pgconn, items, statement, formats))
    finally:
        if not pgconn.is_busy():  # else the connection is broken and is closed by the caller
            pgconn.exit_pipeline_mode()
    if pgconn.status == pq.ConnStatus.BAD:
        raise psycopg.OperationalError(
            f"the connection to PostgreSQL broke: {pgconn.error_message.decode(errors='replace')}"
        )
    statuses = [r[-1].status for r in results if r and r[-1].status != pq.ExecStatus.PIPELINE_SYNC]
    ok = (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK)
    if len(statuses) != len(items) + 3 or any(s not in ok for s in statuses):
        if pgconn.transaction_status != pq.TransactionStatus.IDLE:
            pgconn.send_query(b"ROLLBACK")
            await conn.wait(execute(pgconn))
        return None
    return [_position(r[-1]) for r in results[2 : 2 + len(items)]]


def _position(res: pq.abc.PGresult) -> int | None:
    """The position one append statement recorded, or None when it recorded nothing."""
    value = res.get_value(0, 0) if res.ntuples else None
    return None if value is None else int(value)


async def _answered_callers_queued(queue: list[GroupAppendItem]) -> bool:
    """Give the callers a group just answered one loop step to ask for their next append (a
    writer that appends turn after turn joins the next group instead of going alone before it)."""
    await asyncio.sleep(0)
    return bool(queue)


GroupWriter = Callable[[list[GroupAppendItem]], Awaitable[list[int | None] | None]]
"""Writes one group (:func:`run_group` on a borrowed connection); raises on a broken connection."""


class GroupAppender:
    """One event loop's group commit: turns asked for while another append is being written wait,
    and are then written together by one drain task (see the module's docstring).

    :meth:`join` is for a caller that found :attr:`writing` true; a caller that writes alone wraps
    its write in :meth:`alone`, so that turns arriving meanwhile queue for the next group.
    """

    def __init__(self, write_group: GroupWriter) -> None:
        self._write_group = write_group
        self._queue: list[GroupAppendItem] = []
        self._alone = 0
        self._drain: asyncio.Task[None] | None = None
        self.groups = 0
        """Groups written (a count for tests and benches)."""
        self.grouped_turns = 0
        """Turns recorded as part of a group."""

    @property
    def writing(self) -> bool:
        """Whether an append of this loop is being written now (a new one should join a group)."""
        return self._alone > 0 or self._drain is not None

    async def join(self, run_id: int, session_id: str, values: list[bytes | None]) -> int | None:
        """Queue a turn for the next group; its position, or None: append it alone (the group
        failed, or its statement recorded nothing)."""
        future: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        self._queue.append(GroupAppendItem(run_id, session_id, values, future))
        self._start_drain()
        return await future

    @contextlib.asynccontextmanager
    async def alone(self) -> AsyncIterator[None]:
        """Mark a single append in flight; turns that arrive meanwhile are written together after it."""
        self._alone += 1
        try:
            yield
        finally:
            self._alone -= 1
            self._start_drain()

    def _start_drain(self) -> None:
        if self._queue and self._alone == 0 and self._drain is None:
            self._drain = asyncio.ensure_future(self._write_queued())

    async def _write_queued(self) -> None:
        try:
            while self._queue or await _answered_callers_queued(self._queue):
                items = sorted(
                    self._queue[:MAX_GROUP], key=lambda item: item.run_id
                )  # stable: arrival order per run
                del self._queue[:MAX_GROUP]
                positions = await self._write(items)
                for item, position in zip(items, positions, strict=True):
                    if not item.future.done():
                        item.future.set_result(position)
        finally:
            self._drain = None
            for item in self._queue:  # only when cancelled: the loop is closing
                if not item.future.done():
                    item.future.cancel()
            self._queue.clear()

    async def _write(self, items: list[GroupAppendItem]) -> list[int | None]:
        """The group's positions; all None (each caller appends alone) when it failed."""
        try:
            positions = await self._write_group(items)
        except psycopg.Error:
            positions = None  # a broken connection: each append is retried alone, on a fresh one
        except asyncio.CancelledError:
            for item in items:
                item.future.cancel()
            raise
        except Exception as e:  # not the database's answer: every caller gets it, none waits forever
            log.exception("a group of %d appends failed", len(items))
            for item in items:
                if not item.future.done():
                    item.future.set_exception(e)
            return [None] * len(items)
        if positions is None:
            return [None] * len(items)
        self.groups += 1
        self.grouped_turns += sum(p is not None for p in positions)
        return positions
