"""Invoke ``dressage-worker`` in-process and parse its JSON output."""

from __future__ import annotations

import json
from typing import Any

from typer.testing import CliRunner, Result

from dressage.cli import app


def invoke(cli: CliRunner, db_url: str, *args: str, input: str | None = None) -> Result:
    """Run ``dressage-worker ARGS --database-url DB_URL`` and return the result."""
    return cli.invoke(app, [*args, "--database-url", db_url], input=input)


def sql_json(cli: CliRunner, db_url: str, query: str) -> list[dict[str, Any]]:
    """Rows of ``dressage-worker sql --json QUERY``; fails the test on a non-zero exit."""
    result = invoke(cli, db_url, "sql", "--json", query)
    assert result.exit_code == 0, result.output + result.stderr
    return json.loads(result.stdout)
