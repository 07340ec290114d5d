"""PostgreSQL logins for the tests of users' SQL, which refuses the superuser the test databases are
made with: a reader (``db create-reader``) and a writer (no superuser, but every table's privileges
and CREATEROLE: what a read-only transaction has to stop). One of each per database, made on first
use; ``tests/conftest.py`` drops them after the databases at the end of the session. On SQLite
both are the URL itself.
"""

from __future__ import annotations

import secrets
import sys
import uuid

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

from dressage.store.db import make_engine
from dressage.store.reader_role import create_reader

_CREATED: list[str] = []
_URLS: dict[tuple[str, str], str] = {}


def reader_url(db_url: str) -> str:
    """A reader role's URL on ``db_url``'s PostgreSQL database (``db_url`` itself on SQLite)."""
    if db_url.startswith("sqlite"):
        return db_url
    key = ("reader", db_url)
    if key not in _URLS:
        name = new_role_name("reader")
        engine = make_engine(db_url, pool_size=1)
        try:
            _URLS[key] = create_reader(engine, name)
        finally:
            engine.dispose()
    return _URLS[key]


def writer_url(db_url: str) -> str:
    """The URL of a login that may change every table of ``db_url``'s log and create roles, but is
    no superuser (``db_url`` itself on SQLite)."""
    if db_url.startswith("sqlite"):
        return db_url
    key = ("writer", db_url)
    if key not in _URLS:
        name, password = new_role_name("writer"), secrets.token_urlsafe(16)
        role = sql.Identifier(name)
        with psycopg.connect(libpq_url(db_url), autocommit=True) as conn:
            database = sql.Identifier(conn.info.dbname)
            for statement in (
                sql.SQL("CREATE ROLE {} LOGIN CREATEROLE PASSWORD {}").format(role, sql.Literal(password)),
                sql.SQL("GRANT ALL ON DATABASE {} TO {}").format(database, role),
                sql.SQL("GRANT ALL ON SCHEMA public TO {}").format(role),
                sql.SQL("GRANT ALL ON ALL TABLES IN SCHEMA public TO {}").format(role),
                sql.SQL("GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {}").format(role),
            ):
                conn.execute(statement)
        _URLS[key] = (
            make_url(db_url).set(username=name, password=password).render_as_string(hide_password=False)
        )
    return _URLS[key]


def new_role_name(kind: str) -> str:
    """A fresh role name (roles are shared by every database of the server), dropped at the end."""
    name = f"dressage_test_{kind}_{uuid.uuid4().hex[:10]}"
    _CREATED.append(name)
    return name


def libpq_url(url: str) -> str:
    """``url`` as libpq reads it (without SQLAlchemy's driver name)."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def drop_created_roles(conn: psycopg.Connection) -> None:
    """Drop the roles this session made (after its databases, which held their grants)."""
    for name in _CREATED:
        try:
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))
        except psycopg.Error as e:
            print(f"could not drop test role {name}: {e}", file=sys.stderr)
    _CREATED.clear()
    _URLS.clear()
