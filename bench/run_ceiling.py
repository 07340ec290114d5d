"""The append ceiling of one run: appends serialized on its counter row, vs the same appends spread over runs.

Every turn append bumps its run's ``run_counters`` row in the statement that inserts the event
(the dense, commit-ordered position; see ``PG_APPEND_TURN_SQL``). The row stays locked until the
commit's WAL flush, so one run's appends are serial however many connections write them. This
bench measures that bound on the machine at hand: ``pgbench`` runs the same shape of statement
(counter bump + a ~1.2 KB event insert, autocommit, ``synchronous_commit=on``) from ``--clients``
connections, all on one counter row (one run), then each on its own row (one run per client), in
a private PostgreSQL cluster (see ``bench/scale.py``). The ratio is what partitioning by run buys.

Run: ``python bench/run_ceiling.py [--clients 8] [--seconds 10]``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg
from scale import private_postgres

STATEMENT = (
    "WITH x AS (UPDATE c SET v = v + 1 WHERE id = {row} RETURNING v) "
    "INSERT INTO e SELECT {row}, v, decode(repeat('ab', 1200), 'hex') FROM x;\n"
)


def pgbench(bindir: Path, port: int, script: str, clients: int, seconds: int) -> tuple[float, float]:
    """(transactions/s, mean latency ms) of ``script`` run by ``clients`` connections."""
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script)
    out = subprocess.run(
        [str(bindir / "pgbench"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-n",
         "-c", str(clients), "-j", str(min(clients, 4)), "-T", str(seconds), "-f", f.name, "postgres"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    tps = float(re.search(r"tps = ([\d.]+)", out).group(1))  # type: ignore[union-attr]
    latency = float(re.search(r"latency average = ([\d.]+) ms", out).group(1))  # type: ignore[union-attr]
    return tps, latency


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=10)
    args = parser.parse_args()
    bindir = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)[0]
    with private_postgres(max_connections=100) as pg:
        with psycopg.connect(pg.admin, autocommit=True) as c:
            c.execute("CREATE TABLE c (id int PRIMARY KEY, v bigint NOT NULL)")
            c.execute("INSERT INTO c SELECT g, 0 FROM generate_series(1, 1000) g")
            c.execute("CREATE TABLE e (run int, pos bigint, payload bytea, PRIMARY KEY (run, pos))")
        hot = pgbench(bindir, pg.port, STATEMENT.format(row="1"), args.clients, args.seconds)
        spread = pgbench(bindir, pg.port, STATEMENT.format(row=":client_id + 1"), args.clients, args.seconds)
    print(f"{args.clients} connections, {args.seconds} s each, synchronous_commit=on")
    print(f"{'':<28} {'appends/s':>10} {'mean ms':>8}")
    print(f"{'one run (one counter row)':<28} {hot[0]:>10.0f} {hot[1]:>8.2f}")
    print(f"{'a run per connection':<28} {spread[0]:>10.0f} {spread[1]:>8.2f}")
    print(f"spread / one run: {spread[0] / hot[0]:.2f}x")


if __name__ == "__main__":
    main()
