"""Turns in the log: the durable append (sync and async) and the numpy read paths.

One turn row plus its ``turn`` event per transaction, before the agent sees the reply; the backend's
:class:`~dressage.store.turn_appenders.TurnAppender` does the append after one shared validation
(:func:`~dressage.store.records.prepare_turn`). The proxy uses :meth:`TurnRepository.append_async`.
Reads parse per-token arrays straight into numpy.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from dressage.store.database import Database
from dressage.store.records import AppendResult, NewTurn, Run, Turn, decode_experts, prepare_turn
from dressage.store.runs import RunRepository
from dressage.store.turn_appenders import TurnAppender
from dressage.store.turn_io import fetch_token_columns, fetch_turn_rows, turn_from_row

PARALLEL_READ_MIN_EVENTS = 2_000
"""Runs with more events than twice this are read back over two PostgreSQL connections."""
PARALLEL_READ_MIN_SESSIONS = 32
"""``read`` of at least twice this many sessions uses two PostgreSQL connections."""


class TurnRepository:
    """Turns of the log's sessions."""

    def __init__(self, db: Database, runs: RunRepository, appender: TurnAppender) -> None:
        self.db = db
        self.runs = runs
        self.appender = appender

    def append(self, run: str | Run, turn: NewTurn) -> AppendResult:
        """Record one LLM call: turn row + ``turn`` event in one transaction, before the agent sees it."""
        r = self.runs.get(run)
        return self.appender.append(
            r, prepare_turn(r.name, turn, max_payload_bytes=self.db.max_payload_bytes)
        )

    async def append_async(self, run: str | Run, turn: NewTurn) -> AppendResult:
        """:meth:`append` for event loops (the proxy), without a thread hop on PostgreSQL.

        PostgreSQL appends run on a small pool of async psycopg connections owned by the running
        loop; SQLite appends run on one dedicated writer thread (SQLite writes serialise anyway).
        """
        r = self.runs.get(run)
        return await self.appender.append_async(
            r, prepare_turn(r.name, turn, max_payload_bytes=self.db.max_payload_bytes)
        )

    async def aclose_async(self) -> None:
        """Close the async connections this loop opened for :meth:`append_async`."""
        await self.appender.aclose_async()

    def read(
        self,
        run: str | Run | None = None,
        *,
        session_id: str | None = None,
        session_ids: list[str] | None = None,
        with_experts: bool = True,
    ) -> list[Turn]:
        """Turns of a run or sessions, ordered by session then turn index, arrays as numpy.

        On PostgreSQL a long ``session_ids`` list is read over two connections at once: the server
        spends most of a big read encoding arrays, and two backends use both cores.
        """
        if (
            self.db.dialect == "postgresql"
            and session_ids is not None
            and len(session_ids) >= 2 * PARALLEL_READ_MIN_SESSIONS
        ):
            half = len(session_ids) // 2
            chunks = [session_ids[:half], session_ids[half:]]
            with ThreadPoolExecutor(2) as pool:
                parts = list(
                    pool.map(
                        lambda ids: self.read(
                            run, session_id=session_id, session_ids=ids, with_experts=with_experts
                        ),
                        chunks,
                    )
                )
            return sorted(parts[0] + parts[1], key=lambda x: (x.session_id, x.turn_index))
        clauses: list[str] = []
        params: dict[str, Any] = {}
        if run is not None:
            clauses.append("run_id = %(run_id)s")
            params["run_id"] = self.runs.get(run).id
        if session_id is not None:
            clauses.append("session_id = %(session_id)s")
            params["session_id"] = session_id
        if session_ids is not None:
            if not session_ids:
                return []
            if (
                self.db.dialect == "postgresql"
            ):  # one array parameter: the same (prepared) statement each time
                clauses.append("session_id = ANY(%(session_ids)s)")
                params["session_ids"] = list(session_ids)
            else:
                names = [f"s{i}" for i in range(len(session_ids))]
                clauses.append(f"session_id IN ({', '.join(f'%({n})s' for n in names)})")
                params.update(zip(names, session_ids, strict=True))
        with self.db.read() as conn:
            rows = fetch_turn_rows(conn, " AND ".join(clauses) or "1=1", params, with_experts=with_experts)
        return [_turn(x, with_experts) for x in rows]

    def read_token_arrays(self, run: str | Run) -> dict[str, np.ndarray]:
        """The whole run's tokens as flat numpy arrays (ids, logprobs, mask, versions) plus turn offsets.

        Turns are in position order. Context tokens get logprob NaN, loss_mask False and policy
        version -1. Only the array columns are read, straight into numpy.
        """
        r = self.runs.get(run)
        bound = self.db.last_position(r.id)
        if self.db.dialect == "postgresql" and bound > 2 * PARALLEL_READ_MIN_EVENTS:
            # The server spends most of a big read encoding arrays; two connections use both cores.
            mid = bound // 2
            with ThreadPoolExecutor(2) as pool:
                parts = list(pool.map(lambda rng: self._token_columns(r.id, *rng), [(0, mid), (mid, bound)]))
            rows = parts[0] + parts[1]
        else:
            rows = self._token_columns(r.id, 0, bound)
        n_ctx = np.fromiter((row[0].size for row in rows), dtype=np.int64, count=len(rows))
        n_gen = np.fromiter((row[1].size for row in rows), dtype=np.int64, count=len(rows))
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(n_ctx + n_gen, out=offsets[1:])
        total = int(offsets[-1])
        ids = np.empty(total, dtype=np.int32)
        logprobs = np.full(total, np.nan, dtype=np.float32)
        mask = np.zeros(total, dtype=np.bool_)
        versions = np.full(total, -1, dtype=np.int32)
        for k, (ctx, gen, lps, msk, vers) in enumerate(rows):
            start, mid, end = int(offsets[k]), int(offsets[k] + n_ctx[k]), int(offsets[k + 1])
            ids[start:mid] = ctx
            ids[mid:end] = gen
            logprobs[mid:end] = lps
            mask[mid:end] = msk
            versions[mid:end] = vers
        return {
            "token_ids": ids,
            "logprobs": logprobs,
            "loss_mask": mask,
            "policy_versions": versions,
            "turn_offsets": offsets,
        }

    def _token_columns(self, run_id: int, after: int, upto: int) -> list[tuple[np.ndarray, ...]]:
        with self.db.read() as conn:
            return fetch_token_columns(conn, run_id, after, upto)


def _turn(row: dict[str, Any], with_experts: bool) -> Turn:
    if not with_experts:
        return turn_from_row(row, None)
    experts = (row["experts"], row["experts_shape"], row["experts_dtype"], row["experts_codec"])
    return turn_from_row(row, decode_experts(*experts))
