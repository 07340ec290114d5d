"""The one piece of the package layout that pyproject.toml cannot say: where the migrations go.

The alembic scripts have one source, the repository's top-level ``migrations/`` (``alembic.ini`` and
``alembic`` from a checkout use it). A built wheel carries them inside the package as
``dressage/store/migrations`` (a ``package_dir`` mapping), where :func:`dressage.store.db.migrations_dir`
finds them, so an installed Dressage migrates a database without a checkout. Everything else
(metadata, dependencies, package data) is in pyproject.toml. ``recipes`` is the package of the
recipes (``recipes/README.md``: configs name their code as ``recipes.NAME.module:attr``).
"""

from setuptools import find_packages, setup

MIGRATIONS_PACKAGE = "dressage.store.migrations"

setup(
    packages=[
        *find_packages(include=["dressage*", "workers*", "recipes*"]),
        MIGRATIONS_PACKAGE,
        f"{MIGRATIONS_PACKAGE}.versions",
    ],
    package_dir={MIGRATIONS_PACKAGE: "migrations"},
)
