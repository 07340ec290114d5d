"""Binary PostgreSQL results decoded column by column (:mod:`dressage.store.pg_results`), against
psycopg's own decoding of the same values on a real server."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest

from dressage.store.pg_results import result_columns, result_rows

SELECT = """
SELECT * FROM (VALUES
    (1::int4, 10000000000::int8, 'a'::text, 'é'::varchar, 1.5::float8, '{"k": [1, 2.5, null]}'::jsonb,
     true, '\\x00ff'::bytea, ARRAY[1, -2]::int4[], ARRAY[-0.5]::float4[], ARRAY[true, false]),
    (NULL, -1, NULL, '', NULL, '{}'::jsonb,
     false, NULL, '{}'::int4[], NULL, NULL)
) AS v(i4, i8, t, vc, f8, j, b, by, ai, af, ab)
"""


def _url(pg_url: str) -> str:
    return pg_url.replace("postgresql+psycopg://", "postgresql://", 1)


def test_columns_decode_as_psycopg_does(pg_url: str) -> None:
    with psycopg.connect(_url(pg_url)) as conn, conn.cursor(binary=True) as cur:
        cur.execute(SELECT)
        assert cur.pgresult is not None
        rows = result_rows(cur.pgresult)
        expected = cur.fetchall()
    assert len(rows) == len(expected) == 2
    for row, want in zip(rows, expected, strict=True):
        got = list(row.values())
        for name, value, reference in zip(row, got, want, strict=True):
            if isinstance(value, np.ndarray):
                assert value.tolist() == list(reference), name
            else:
                assert value == reference and type(value) is type(reference), name


def test_an_unknown_column_type_is_refused(pg_url: str) -> None:
    with psycopg.connect(_url(pg_url)) as conn, conn.cursor(binary=True) as cur:
        cur.execute("SELECT now()")
        assert cur.pgresult is not None
        with pytest.raises(TypeError, match="no binary decoder for PostgreSQL type oid 1184"):
            result_columns(cur.pgresult)
