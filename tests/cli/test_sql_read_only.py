"""``dressage-worker sql`` cannot change the log, because the database refuses, on both backends.

Each attack runs as a login that may write every table and create roles (on PostgreSQL; the
superuser the test databases are made with is refused outright, see below) and must end in one
``error:`` line with the log unchanged (``tests/log_state.py``: row hashes, schema, roles, large
objects, the SQLite file's bytes) and no file created. Queries whose literals and comments hold
``;``, ``--`` or ``/*`` are answered. The reader role of ``db create-reader`` reads, and the
database itself refuses its writes even outside ``sql``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from tests.cli.conftest import Populated
from tests.cli.helpers import invoke, sql_json
from tests.log_state import log_state
from tests.pg_roles import libpq_url, new_role_name, writer_url

BOTH = [
    "SELECT '--'; COMMIT; DROP TABLE events CASCADE",
    "COMMIT; DELETE FROM turns",
    "DELETE FROM turns",
    "UPDATE sessions SET reward = 42, status = 'finished'",
    "SELECT 1; UPDATE sessions SET reward = 42",
    "/* ; */ DELETE FROM turns -- ;",
    "INSERT INTO runs (name, config, config_hash, created_at) VALUES ('@NAME@', '{}', 'x', 0)",
    "CREATE TABLE @NAME@ (a TEXT)",
    "ALTER TABLE runs ADD COLUMN @NAME@ TEXT",
    "DROP TABLE events",
    "DROP VIEW trajectories",
    "WITH gone AS (DELETE FROM turns RETURNING id) SELECT count(*) FROM gone",
    "COMMIT",
]
POSTGRES = [
    "SELECT '--'; COMMIT; COPY (SELECT 1) TO PROGRAM 'touch @PATH@'",
    "COPY (SELECT 1) TO PROGRAM 'touch @PATH@'",
    "COPY (SELECT 1) TO '@PATH@'",
    "CREATE ROLE @NAME@ SUPERUSER LOGIN",
    "SELECT '--'; COMMIT; CREATE ROLE @NAME@",
    "CREATE ROLE @NAME@",
    "TRUNCATE turns CASCADE",
    "SET TRANSACTION READ WRITE",
    "DO $$ BEGIN DELETE FROM turns; END $$",
    "DO $$ BEGIN SET TRANSACTION READ WRITE; DELETE FROM turns; COMMIT; END $$",
    "DO $$ BEGIN PERFORM set_config('transaction_read_only', 'off', true); DELETE FROM turns; END $$",
    "SELECT nextval('runs_id_seq')",
    "GRANT ALL ON runs TO PUBLIC",
    "PREPARE TRANSACTION '@NAME@'",
    "SELECT pg_create_physical_replication_slot('@NAME@')",
    "LOCK TABLE turns IN ACCESS EXCLUSIVE MODE",
    "SELECT * FROM runs FOR UPDATE",
    "EXPLAIN ANALYZE DELETE FROM turns",
    "CREATE TEMP TABLE @NAME@ (a int)",
    "VACUUM turns",
]
ROLLED_BACK = ["SELECT lo_from_bytea(0, 'x')", "SELECT lo_create(0)"]
"""PostgreSQL lets a read-only transaction create large objects; the rollback removes them."""
SQLITE = [
    "ATTACH DATABASE '@PATH@' AS other",
    "VACUUM INTO '@PATH@'",
    "VACUUM",
    "PRAGMA user_version = 7",
    "PRAGMA journal_mode = DELETE",
    "PRAGMA query_only = OFF",
    "PRAGMA writable_schema = ON",
    "SELECT load_extension('@PATH@')",
    "REPLACE INTO runs (id, name, config, config_hash, created_at) SELECT id, name, '{}', 'x', 0 FROM runs",
    "CREATE TEMP TABLE @NAME@ (a)",
    "ANALYZE",
    "REINDEX",
    "CREATE TRIGGER @NAME@ AFTER INSERT ON runs BEGIN DELETE FROM turns; END",
]


@pytest.fixture(scope="module")
def drop_dir() -> Iterator[Path]:
    """A directory every user may write to (the database server's too): no attack may leave a file."""
    path = Path(tempfile.mkdtemp(prefix="dressage-sql-"))
    os.chmod(path, 0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _refused_and_nothing_changed(
    cli: CliRunner, db_url: str, template: str, drop_dir: Path, *, answered: bool = False
) -> None:
    name = f"dressage_attack_{uuid.uuid4().hex[:10]}"
    target = drop_dir / name
    query = template.replace("@NAME@", name).replace("@PATH@", str(target))
    login = writer_url(db_url)
    watched = [name, make_url(login).username or ""]
    before = log_state(db_url, roles=watched)
    result = invoke(cli, login, "sql", query)
    lines = result.stderr.strip().splitlines()
    if answered:
        assert result.exit_code == 0, (query, result.output)
    else:
        assert result.exit_code == 1, (query, result.output)
        assert len(lines) == 1 and lines[0].startswith("error: "), (query, result.stderr)
    assert "Traceback" not in result.output
    assert log_state(db_url, roles=watched) == before, query
    assert not target.exists(), query


@pytest.mark.parametrize("attack", BOTH)
def test_attack_is_refused_and_changes_nothing(
    cli: CliRunner, db_url: str, populated: Populated, drop_dir: Path, attack: str
) -> None:
    _refused_and_nothing_changed(cli, db_url, attack, drop_dir)


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
@pytest.mark.parametrize("attack", POSTGRES)
def test_postgres_attack_is_refused_and_changes_nothing(
    cli: CliRunner, db_url: str, populated: Populated, server_writes: Path, attack: str
) -> None:
    _refused_and_nothing_changed(cli, db_url, attack, server_writes)


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
@pytest.mark.parametrize("statement", ROLLED_BACK)
def test_large_objects_made_in_the_transaction_are_rolled_back(
    cli: CliRunner, db_url: str, populated: Populated, drop_dir: Path, statement: str
) -> None:
    _refused_and_nothing_changed(cli, db_url, statement, drop_dir, answered=True)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("attack", SQLITE)
def test_sqlite_attack_is_refused_and_changes_nothing(
    cli: CliRunner, db_url: str, populated: Populated, drop_dir: Path, attack: str
) -> None:
    _refused_and_nothing_changed(cli, db_url, attack, drop_dir)


@pytest.fixture(scope="module")
def server_writes(pg_url: str, drop_dir: Path) -> Path:
    """``drop_dir``, once the PostgreSQL server has shown it can create a file there (as the
    superuser): so an attack's missing file means a refusal, not a server that could not write."""
    control = drop_dir / f"control-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(libpq_url(pg_url), autocommit=True) as conn:
        # `cat`, not `touch`: a program that leaves its stdin unread may break COPY's pipe.
        conn.execute(f"COPY (SELECT 1) TO PROGRAM 'cat > {control}'")  # type: ignore[arg-type]
    if not control.exists():
        pytest.skip("the PostgreSQL server does not share this machine's files: cannot watch them")
    return drop_dir


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_superuser_login_is_refused(
    cli: CliRunner, db_url: str, populated: Populated, server_writes: Path
) -> None:
    """A superuser runs programs and writes files even in a read-only transaction, and takes back any
    privilege it drops within one statement: ``sql`` refuses it before running anything."""
    target = server_writes / f"superuser-{uuid.uuid4().hex[:8]}"
    before = log_state(db_url)
    for query in ("SELECT 1", f"COPY (SELECT 1) TO PROGRAM 'touch {target}'"):
        result = invoke(cli, db_url, "sql", query)
        assert result.exit_code == 1
        [line] = result.stderr.strip().splitlines()
        assert "is a superuser" in line and "db create-reader" in line, line
    assert log_state(db_url) == before
    assert not target.exists()


def test_literals_with_semicolons_and_comment_marks_are_answered(
    cli: CliRunner, db_url: str, populated: Populated
) -> None:
    run = f"(SELECT id FROM runs WHERE name = '{populated.run}')"
    answers = {
        f"SELECT count(*) AS n FROM sessions WHERE status <> ';' AND run_id = {run}": [{"n": 4}],
        "SELECT ';' AS a, '--' AS b, '/*' AS c, '*/' AS d": [{"a": ";", "b": "--", "c": "/*", "d": "*/"}],
        f"SELECT count(*) AS n FROM runs WHERE name <> 'a;b--c/*d' AND id = {run}": [{"n": 1}],
        "SELECT 1 AS one -- a comment; with a semicolon\n; -- and a trailing one; /*": [{"one": 1}],
        "/* a ; block -- */ SELECT 2 AS two /* ; */": [{"two": 2}],
        "SELECT '100%' AS p, ':name' AS q, '?' AS r": [{"p": "100%", "q": ":name", "r": "?"}],
        f"SELECT count(*) AS n FROM sessions WHERE status <> 'x''; DROP TABLE runs; --' AND run_id = {run}": [
            {"n": 4}
        ],
    }
    for query, rows in answers.items():
        assert sql_json(cli, db_url, query) == rows, query


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_reader_role_reads_and_the_database_refuses_its_writes(
    cli: CliRunner, db_url: str, populated: Populated
) -> None:
    name = new_role_name("cli_reader")
    made = invoke(cli, db_url, "db", "create-reader", name)
    assert made.exit_code == 0, made.output
    url = made.stdout.strip()
    password = make_url(url).password
    assert password and "password is in this URL only" in made.stderr
    with psycopg.connect(libpq_url(db_url)) as admin:
        (stored,) = admin.execute(
            "SELECT rolpassword FROM pg_authid WHERE rolname = %s", (name,)
        ).fetchone() or ("",)
    assert stored.startswith("SCRAM-SHA-256$") and password not in stored  # only the verifier
    before = log_state(db_url, roles=[name])

    rows = json.loads(invoke(cli, url, "sql", "--json", "SELECT count(*) AS n FROM trajectories").stdout)
    assert rows[0]["n"] >= 4
    refused = invoke(
        cli, url, "sql", "INSERT INTO runs (name, config, config_hash, created_at) VALUES ('x', '{}', 'x', 0)"
    )
    assert refused.exit_code == 1 and "read-only" in refused.stderr
    # Past `sql`: the reader's own connection, its read-only default switched off, still may not write.
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute("SET default_transaction_read_only = off")
        for write in (
            "INSERT INTO runs (name, config, config_hash, created_at) VALUES ('x', '{}', 'x', 0)",
            "DELETE FROM turns",
            "UPDATE sessions SET reward = 42",
            "CREATE TABLE reader_table (a int)",
            "DROP VIEW trajectories",
        ):
            with pytest.raises(
                psycopg.errors.InsufficientPrivilege, match=r"permission denied|must be owner"
            ):
                conn.execute(write)  # type: ignore[arg-type]
    assert log_state(db_url, roles=[name]) == before

    again = invoke(cli, db_url, "db", "create-reader", name)
    assert again.exit_code == 1 and "already exists" in again.stderr
    not_reader = invoke(cli, db_url, "db", "drop-reader", make_url(writer_url(db_url)).username or "")
    assert not_reader.exit_code == 1 and "not a reader" in not_reader.stderr
    dropped = invoke(cli, db_url, "db", "drop-reader", name)
    assert dropped.exit_code == 0, dropped.output
    assert log_state(db_url, roles=[name])["roles"] == []


def test_create_reader_refusals(cli: CliRunner, db_url: str) -> None:
    bad = invoke(cli, db_url, "db", "create-reader", "Bad-Name")
    assert bad.exit_code != 0
    [line] = bad.stderr.strip().splitlines()
    if db_url.startswith("sqlite"):
        assert "reader roles need PostgreSQL" in line and "mode=ro" in line
    else:
        assert "NAME 'Bad-Name' must be" in line


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_login_that_may_run_programs_is_refused(
    cli: CliRunner, db_url: str, populated: Populated, server_writes: Path
) -> None:
    """No superuser, but a member of pg_execute_server_program: COPY ... TO PROGRAM would run, read-only
    transaction or not, so ``sql`` refuses the login."""
    name, password = new_role_name("programs"), uuid.uuid4().hex
    with psycopg.connect(libpq_url(db_url), autocommit=True) as admin:
        create = f"CREATE ROLE {name} LOGIN PASSWORD '{password}' IN ROLE pg_execute_server_program"
        admin.execute(create)  # type: ignore[arg-type]
        admin.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {name}")  # type: ignore[arg-type]
    login = make_url(db_url).set(username=name, password=password).render_as_string(hide_password=False)
    target = server_writes / f"programs-{uuid.uuid4().hex[:8]}"
    before = log_state(db_url, roles=[name])
    result = invoke(cli, login, "sql", f"COPY (SELECT 1) TO PROGRAM 'cat > {target}'")
    assert result.exit_code == 1
    [line] = result.stderr.strip().splitlines()
    assert f"login '{name}' may act as 'pg_execute_server_program'" in line, line
    assert log_state(db_url, roles=[name]) == before
    assert not target.exists()
