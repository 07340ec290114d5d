"""Property: whatever sequence of statements users' SQL is given (reads, writes, DDL, transaction
control, joined by ``;`` and comments, with literals full of ``;``, ``--``, ``/*`` and quotes), the
log is unchanged byte for byte, on both backends, as a login that may write every table. And the
database answers exactly the single reads: the refusals come from the database, not from the
characters a statement holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import make_url

from dressage.errors import InvalidRecordError, StoreError
from dressage.store import EventStore, TaskSpec
from dressage.store.read_only_sql import run_read_only
from tests.log_builders import record_one_turn_session
from tests.log_state import log_state
from tests.pg_roles import writer_url
from tests.stores import open_store

READS = [
    "SELECT @LIT@ AS a",
    "SELECT count(*) AS n FROM sessions WHERE status <> @LIT@",
    "SELECT name FROM runs WHERE name = @LIT@ OR name <> @LIT@ /* ; */ ORDER BY name",
    "WITH x AS (SELECT @LIT@ AS v) SELECT v FROM x",
]
WRITES = [
    "DELETE FROM turns WHERE @LIT@ <> 'x'",
    "UPDATE sessions SET status = @LIT@",
    "INSERT INTO runs (name, config, config_hash, created_at) VALUES (@LIT@, '{}', 'x', 0)",
    "DROP TABLE events",
    "CREATE TABLE prop_table (a TEXT DEFAULT @LIT@)",
    "ALTER TABLE runs ADD COLUMN prop_column TEXT DEFAULT @LIT@",
    "DROP VIEW trajectories",
    "COMMIT",
    "BEGIN",
    "ROLLBACK",
    "END",
    "SAVEPOINT s",
    "RELEASE SAVEPOINT s",
]
POSTGRES_WRITES = [
    "CREATE ROLE prop_role_x SUPERUSER",
    "TRUNCATE turns CASCADE",
    "SET TRANSACTION READ WRITE",
    "DO $$ BEGIN DELETE FROM turns; END $$",
    "COPY (SELECT 1) TO PROGRAM 'true'",
    "SELECT nextval('runs_id_seq')",
]
SQLITE_WRITES = [
    "PRAGMA user_version = 9",
    "ATTACH ':memory:' AS m",
    "PRAGMA query_only = OFF",
    "VACUUM",
    "ANALYZE",
]
SEPARATORS = [";", "; ", ";\n", "; -- c;\n", " /* ; */ ;"]
_TEXT = st.text(alphabet=";-/*' \n$ab", max_size=10)
_COMMENT = st.text(alphabet=";-/' $ab", max_size=10).filter(lambda t: "/*" not in t and "*/" not in t)


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


@st.composite
def sequences(draw: st.DrawFn, writes: list[str]) -> tuple[str, bool]:
    """A statement sequence, and whether it is exactly one read (which must be answered)."""
    parts = draw(st.lists(st.sampled_from(READS + writes), min_size=1, max_size=4))
    stmts = [p.replace("@LIT@", _literal(draw(_TEXT))) for p in parts]
    text = stmts[0]
    for stmt in stmts[1:]:
        text += draw(st.sampled_from(SEPARATORS)) + stmt
    if draw(st.booleans()):
        text += draw(st.sampled_from(SEPARATORS))
    comment = draw(st.one_of(st.none(), _COMMENT))
    if comment is not None:
        text = draw(st.sampled_from([f"-- {comment}\n{text}", f"/* {comment} */ {text}"]))
    return text, len(stmts) == 1 and parts[0] in READS


@pytest.fixture
def writer(db_url: str, store: EventStore, run_name: str, tmp_path: Path) -> Iterator[EventStore]:
    """A run in the log, and a store on a login that may write every table (the URL on SQLite)."""
    store.runs.create(run_name, {"model": "tiny"})
    store.tasks.enqueue(run_name, [TaskSpec(task_index=0, payload={"prompt": "p; -- /*"})])
    task_id = store.tasks.pairs(run_name)[0].id
    ids = ([1, 2, 3], [4, 5])
    record_one_turn_session(
        store, run_name, f"{run_name}-s", task_id=task_id, agent="whitebox", ids=ids, version=0, reward=1.0
    )
    with open_store(writer_url(db_url), tmp_path / "writer") as s:
        yield s


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_no_statement_sequence_changes_the_log(db_url: str, writer: EventStore, data: st.DataObject) -> None:
    writes = WRITES + (SQLITE_WRITES if db_url.startswith("sqlite") else POSTGRES_WRITES)
    roles = ["prop_role_x", make_url(writer_url(db_url)).username or ""]
    before = log_state(db_url, roles=roles)
    query, single_read = data.draw(sequences(writes))
    try:
        run_read_only(writer.db, query, limit=5)
        answered = True
    except (StoreError, InvalidRecordError) as e:
        assert "\n" not in str(e)
        answered = False
    assert log_state(db_url, roles=roles) == before, query
    assert answered == single_read, query
