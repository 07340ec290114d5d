"""Alembic environment: one migration history for PostgreSQL and SQLite."""

from __future__ import annotations

from alembic import context

from dressage.config import load_settings
from dressage.store.db import make_engine
from dressage.store.schema import metadata

config = context.config
url = config.get_main_option("sqlalchemy.url") or load_settings().resolved_database_url()


def run_migrations_offline() -> None:
    """Emit SQL without a connection (``alembic upgrade --sql``)."""
    context.configure(url=url, target_metadata=metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run migrations on a live connection."""
    connectable = make_engine(url)
    with connectable.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=metadata,
            render_as_batch=connection.dialect.name == "sqlite",
            compare_type=True,
        )
        with context.begin_transaction():
            context.run_migrations()
    connectable.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
