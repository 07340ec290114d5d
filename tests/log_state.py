"""Everything users' SQL could change in a log, read as the database's administrator: a hash of
every table's rows, the schema, sequences, large objects, prepared transactions, the named roles
and replication slots (PostgreSQL); the schema, rows and the file's bytes (SQLite). Two equal
states mean that nothing was written.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

from tests.pg_roles import libpq_url

_PG_QUERIES = {
    "tables": "SELECT table_name FROM information_schema.tables "
    "WHERE table_schema = 'public' AND table_type = 'BASE TABLE' ORDER BY 1",
    "columns": "SELECT table_schema, table_name, column_name, data_type, column_default, is_nullable "
    "FROM information_schema.columns WHERE table_schema NOT IN ('pg_catalog', 'information_schema') "
    "ORDER BY 1, 2, 3",
    "relations": "SELECT n.nspname, c.relname, c.relkind, c.relowner, coalesce(c.relacl::text, '') "
    "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') "
    "AND n.nspname NOT LIKE 'pg_temp%' AND n.nspname NOT LIKE 'pg_toast_temp%' ORDER BY 1, 2",
    "views": "SELECT schemaname, viewname, definition FROM pg_views "
    "WHERE schemaname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1, 2",
    "functions": "SELECT n.nspname, p.proname, pg_get_function_identity_arguments(p.oid) FROM pg_proc p "
    "JOIN pg_namespace n ON n.oid = p.pronamespace "
    "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1, 2, 3",
    "sequences": "SELECT schemaname, sequencename, last_value FROM pg_sequences ORDER BY 1, 2",
    "large_objects": "SELECT oid, lomowner, coalesce(lomacl::text, '') FROM pg_largeobject_metadata ORDER BY 1",
    "large_object_data": "SELECT md5(coalesce(string_agg(loid::text || ':' || pageno || ':' || md5(data), ',' "
    "ORDER BY loid, pageno), '')) FROM pg_largeobject",
    "prepared_xacts": "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() ORDER BY 1",
    "database": "SELECT datname, datdba, coalesce(datacl::text, '') FROM pg_database "
    "WHERE datname = current_database()",
    "default_acl": "SELECT defaclrole, defaclnamespace, defaclobjtype, defaclacl::text FROM pg_default_acl "
    "ORDER BY 1, 2, 3",
}


def log_state(admin_url: str, *, roles: Iterable[str] = ()) -> dict[str, Any]:
    """The state of the log at ``admin_url``; on PostgreSQL also the roles and replication slots
    named ``roles`` (roles are shared by the server's databases, which other tests use)."""
    if admin_url.startswith("sqlite"):
        return _sqlite_state(Path(make_url(admin_url).database or ""))
    return _pg_state(admin_url, sorted(roles))


def _pg_state(admin_url: str, roles: list[str]) -> dict[str, Any]:
    with psycopg.connect(libpq_url(admin_url), autocommit=True) as conn:
        state: dict[str, Any] = {k: conn.execute(q).fetchall() for k, q in _PG_QUERIES.items()}  # type: ignore[arg-type]
        for (table,) in state["tables"]:
            query = sql.SQL(
                "SELECT count(*), md5(coalesce(string_agg(t::text, E'\\n' ORDER BY t::text), '')) FROM {} t"
            ).format(sql.Identifier(table))
            state[f"rows:{table}"] = conn.execute(query).fetchone()
        state["roles"] = conn.execute(
            "SELECT rolname, rolsuper, rolinherit, rolcreaterole, rolcreatedb, rolcanlogin, "
            "rolreplication, rolbypassrls, rolconnlimit, rolpassword, rolvaliduntil "
            "FROM pg_authid WHERE rolname = ANY(%s) ORDER BY 1",
            (roles,),
        ).fetchall()
        state["role_settings"] = conn.execute(
            "SELECT r.rolname, s.setconfig FROM pg_db_role_setting s JOIN pg_authid r ON r.oid = s.setrole "
            "WHERE r.rolname = ANY(%s) ORDER BY 1",
            (roles,),
        ).fetchall()
        state["slots"] = conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE slot_name = ANY(%s)", (roles,)
        ).fetchall()
    return state


def _sqlite_state(path: Path) -> dict[str, Any]:
    state: dict[str, Any] = {
        name: hashlib.sha256(p.read_bytes() if p.exists() else b"").hexdigest()
        for name, p in (("file", path), ("wal", path.with_name(path.name + "-wal")))
    }
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        master = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY 1, 2").fetchall()
        state["schema"] = master
        for kind, name, _table, _sql in master:
            if kind == "table":
                rows = sorted(repr(r) for r in conn.execute(f'SELECT * FROM "{name}"'))
                state[f"rows:{name}"] = (len(rows), hashlib.sha256("\n".join(rows).encode()).hexdigest())
        for pragma in ("user_version", "application_id", "journal_mode", "page_count"):
            state[pragma] = conn.execute(f"PRAGMA {pragma}").fetchall()
    finally:
        conn.close()
    return state
