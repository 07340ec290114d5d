"""Reader roles: PostgreSQL logins with SELECT on the log's tables and views and nothing else.

``dressage-worker db create-reader NAME`` is the way to give analysts or agents the log: they run
``dressage-worker sql --database-url URL`` (or any client) as a role the database itself keeps from
writing, whatever the SQL. The password is random, printed once inside the URL and kept nowhere by
Dressage; the server is sent only its SCRAM verifier (libpq's ``PQencryptPasswordConn``), so no
statement log holds it either. A comment marks the role as a reader, so ``db drop-reader`` never
drops another role.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy.engine import Engine

from dressage.errors import ConfigError, StoreError

READER_COMMENT = "dressage reader: SELECT on the event log (dressage-worker db create-reader)"
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def create_reader(engine: Engine, name: str) -> str:
    """Create the reader role ``name`` on ``engine``'s database; return its ``postgresql://`` URL
    (with the password).

    It may log in and SELECT from every table and view of the log's schema (tables a later
    ``db upgrade`` by this login adds included); its sessions start read-only.
    """
    _check_name(engine, name)
    password = secrets.token_urlsafe(24)
    with _admin_cursor(engine) as (conn, cur):
        if _role_comment(cur, name, missing="") != "":
            raise StoreError(f"a role named {name!r} already exists; choose another NAME")
        verifier = conn.pgconn.encrypt_password(password.encode(), name.encode(), b"scram-sha-256")
        role, (database, schema) = sql.Identifier(name), _where(cur)
        for statement in (
            sql.SQL(
                "CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS "
                "PASSWORD {}"
            ).format(role, sql.Literal(verifier.decode())),
            sql.SQL("COMMENT ON ROLE {} IS {}").format(role, sql.Literal(READER_COMMENT)),
            sql.SQL("ALTER ROLE {} SET default_transaction_read_only = on").format(role),
            sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(database, role),
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(schema, role),
            sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}").format(schema, role),
            sql.SQL("ALTER DEFAULT PRIVILEGES IN SCHEMA {} GRANT SELECT ON TABLES TO {}").format(
                schema, role
            ),
        ):
            cur.execute(statement)
    url = engine.url.set(drivername="postgresql", username=name, password=password)
    return url.render_as_string(hide_password=False)  # libpq's form: psql and `sql` both take it


def drop_reader(engine: Engine, name: str) -> None:
    """Revoke what :func:`create_reader` granted and drop the role; refuse a role it did not make."""
    _check_name(engine, name)
    with _admin_cursor(engine) as (_conn, cur):
        comment = _role_comment(cur, name, missing=None)
        if comment is None:
            raise StoreError(f"no role named {name!r}")
        if comment != READER_COMMENT:
            raise StoreError(f"role {name!r} is not a reader made by `db create-reader`; not dropped")
        role, (database, schema) = sql.Identifier(name), _where(cur)
        for statement in (
            sql.SQL("ALTER DEFAULT PRIVILEGES IN SCHEMA {} REVOKE ALL ON TABLES FROM {}").format(
                schema, role
            ),
            sql.SQL("REVOKE ALL ON ALL TABLES IN SCHEMA {} FROM {}").format(schema, role),
            sql.SQL("REVOKE ALL ON SCHEMA {} FROM {}").format(schema, role),
            sql.SQL("REVOKE ALL ON DATABASE {} FROM {}").format(database, role),
            sql.SQL("DROP ROLE {}").format(role),
        ):
            cur.execute(statement)


def _check_name(engine: Engine, name: str) -> None:
    if engine.dialect.name != "postgresql":
        raise ConfigError(
            "reader roles need PostgreSQL: a SQLite log has no logins. `sql` opens a SQLite file "
            "read-only (mode=ro, query_only) already; give others a copy of the file"
        )
    if not _NAME.fullmatch(name):
        raise ConfigError(
            f"NAME {name!r} must be 1-63 lowercase letters, digits or '_', not starting with a digit"
        )


@contextmanager
def _admin_cursor(engine: Engine) -> Iterator[tuple[psycopg.Connection[Any], psycopg.Cursor[Any]]]:
    """One transaction on a connection of its own, committed when the block succeeds."""
    raw = engine.raw_connection()
    conn: psycopg.Connection[Any] = raw.driver_connection  # type: ignore[assignment]
    try:
        with conn.cursor() as cur:
            yield conn, cur
        conn.commit()
    except psycopg.Error as e:
        conn.rollback()
        raise StoreError(f"could not change the reader role: {str(e).strip().splitlines()[0]}") from e
    except BaseException:
        conn.rollback()
        raise
    finally:
        raw.close()


def _role_comment(cur: psycopg.Cursor[Any], name: str, *, missing: str | None) -> str | None:
    cur.execute(
        "SELECT coalesce(shobj_description(oid, 'pg_authid'), '') FROM pg_roles WHERE rolname = %s", (name,)
    )
    row = cur.fetchone()
    return missing if row is None else str(row[0])


def _where(cur: psycopg.Cursor[Any]) -> tuple[sql.Identifier, sql.Identifier]:
    """The database and the schema the log's tables live in (the login's current schema)."""
    cur.execute("SELECT current_database(), current_schema()")
    row = cur.fetchone()
    if row is None or row[1] is None:
        raise StoreError("the login has no current schema: set its search_path to the log's schema")
    return sql.Identifier(row[0]), sql.Identifier(row[1])
