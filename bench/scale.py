"""A load model, measured: K concurrent agent sessions through P proxy processes into one PostgreSQL.

For each K of ``--sessions`` (default 100; the full model is ``100,1000,5000``) this starts, on
loopback only:

* a private PostgreSQL cluster (``initdb`` into a temporary directory, its own port), so its CPU
  and WAL are this run's alone on a machine other work shares (``--pg-admin-url`` uses an existing
  server instead: WAL and CPU are then the whole server's);
* optionally PgBouncer in front of it (``--pooler none,pgbouncer-session,pgbouncer-transaction``
  runs every K once per pooler). Transaction pooling fails with PgBouncer < 1.21: the append path
  uses protocol-level prepared statements (see docs/scale.md);
* a stub engine process speaking SGLang's ``/generate`` (a fixed tool-call reply with logprobs after
  ``--gen-ms`` of simulated generation: a benchmark harness, not a test double);
* P ``dressage-worker proxy`` processes against the one database;
* client processes running K simulated agents: each opens a session (round-robin over the
  proxies), then runs a chat-completions tool loop of ``--turns`` turns (each tool result adds
  ~300 tokens), thinking ``--think-ms`` (uniformly jittered) between turns, for at most
  ``--duration`` seconds.

After each proxied turn the agent sends the same-length prompt straight to the engine: the
*proxy-added* latency of a turn is the proxied call minus that direct call, measured in the same
run and under the same load. Reported per K: turns/s and logged tokens/s (prompt growth plus
generated tokens, i.e. what the log stores), proxy-added p50/p99, PostgreSQL CPU per 1k logged
tokens (all processes of the private cluster, from ``/proc/<pid>/stat``), WAL bytes per logged
token (``pg_current_wal_lsn`` difference), the most connections the database saw
(``pg_stat_activity``), proxy CPU per 1k tokens, and errors by kind. The machine (cores, load
average, the share of CPU others used during the run) is printed with the figures.

Run: ``python bench/scale.py [--sessions 100,1000,5000] [--proxies 2] [--turns 4] [--think-ms 2000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import pwd
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx
import psycopg
from proxy_overhead import CALL_TEXT, ChatLoop, InstantEngine, pct

ROOT = Path(__file__).resolve().parents[1]

ADMIN_TOKEN = "scale-bench-admin-token"
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --- processes ---------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (PostgreSQL backends and helpers of a postmaster)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                out.append(int(entry.name))
    return out


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    parts = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = parts[3] + parts[4]
    return sum(parts) - idle, sum(parts)


def wait_http(url: str, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while True:
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        if time.time() > deadline:
            raise RuntimeError(f"{url} did not come up")
        time.sleep(0.1)


@dataclass
class Postgres:
    """A PostgreSQL server: ``admin`` conninfo, the postmaster pid when it is our private cluster."""

    admin: str
    postmaster: int | None
    port: int

    def pids(self) -> list[int]:
        return [self.postmaster, *children(self.postmaster)] if self.postmaster else []

    def cpu(self, db: str) -> dict[int, float]:
        """CPU seconds by pid of the private cluster's processes, else of the backends serving ``db``."""
        if self.postmaster:
            return {p: cpu_seconds(p) for p in self.pids()}
        with psycopg.connect(self.admin, autocommit=True) as c:
            rows = c.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", (db,)).fetchall()
        return {r[0]: cpu_seconds(r[0]) for r in rows}


@contextlib.contextmanager
def private_postgres(max_connections: int) -> Iterator[Postgres]:
    """``initdb`` a throwaway cluster on a free loopback port (as user postgres when run as root)."""
    bindir = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)), None)
    if bindir is None:
        raise RuntimeError("no PostgreSQL binaries under /usr/lib/postgresql (use --pg-admin-url)")
    data = Path(tempfile.mkdtemp(prefix="dressage-scale-pg-"))
    port = free_port()
    as_pg: list[str] = []
    if os.geteuid() == 0:
        pg = pwd.getpwnam("postgres")
        os.chown(data, pg.pw_uid, pg.pw_gid)
        as_pg = ["runuser", "-u", "postgres", "--"]
    subprocess.run([*as_pg, str(bindir / "initdb"), "-D", str(data / "d"), "-A", "trust", "-U", "postgres"],
                   check=True, capture_output=True)  # fmt: skip
    opts = (f"-c port={port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={data} "
            f"-c max_connections={max_connections} -c shared_buffers=256MB")  # fmt: skip
    subprocess.run([*as_pg, str(bindir / "pg_ctl"), "-D", str(data / "d"), "-o", opts, "-l", str(data / "log"),
                    "-w", "start"], check=True, capture_output=True)  # fmt: skip
    try:
        postmaster = int((data / "d" / "postmaster.pid").read_text().split()[0])
        yield Postgres(f"postgresql://postgres@127.0.0.1:{port}/postgres", postmaster, port)
    finally:
        subprocess.run([*as_pg, str(bindir / "pg_ctl"), "-D", str(data / "d"), "-m", "immediate", "stop"],
                       capture_output=True)  # fmt: skip
        shutil.rmtree(data, ignore_errors=True)


@contextlib.contextmanager
def pgbouncer(pg: Postgres, db: str, pool_size: int, mode: str) -> Iterator[int]:
    """PgBouncer in ``mode`` (transaction or session pooling) in front of ``db``; yields its port."""
    exe = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not Path(exe).exists():
        raise RuntimeError("pgbouncer is not installed (apt-get install pgbouncer)")
    with psycopg.connect(pg.admin, autocommit=True) as c:
        c.execute(f'ALTER DATABASE "{db}" SET synchronous_commit = on')
        c.execute(f"ALTER DATABASE \"{db}\" SET timezone = 'UTC'")
    work = Path(tempfile.mkdtemp(prefix="dressage-scale-pgb-"))
    port = free_port()
    (work / "users.txt").write_text('"postgres" ""\n')
    (work / "pgbouncer.ini").write_text(
        f"[databases]\n{db} = host=127.0.0.1 port={pg.port} dbname={db}\n[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nauth_type = trust\nauth_file = {work}/users.txt\n"
        f"pool_mode = {mode}\ndefault_pool_size = {pool_size}\nmax_client_conn = 20000\n"
        # The store sends its settings as the startup parameter "options", which PgBouncer refuses
        # ("unsupported startup parameter: options"): ignore it and set them on the database instead.
        "ignore_startup_parameters = options\n"
        f"unix_socket_dir =\nlogfile = {work}/log\npidfile = {work}/pid\n"
    )
    user: dict[str, Any] = {}
    if os.geteuid() == 0:
        pg_user = pwd.getpwnam("postgres")
        shutil.chown(work, "postgres")
        for f in work.iterdir():
            shutil.chown(f, "postgres")
        user = {"user": pg_user.pw_uid, "group": pg_user.pw_gid}
    proc = subprocess.Popen([exe, str(work / "pgbouncer.ini")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, **user)  # fmt: skip
    try:
        for _ in range(100):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def spawn(args: list[str], env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        if proc.returncode not in (0, -15, None):
            log.seek(0)
            tail = log.read().decode(errors="replace")[-2000:]
            print(f"{args[:4]} exited {proc.returncode}: {tail}", file=sys.stderr)


# --- the stub engine ---------------------------------------------------------------------------------


class StubEngine(InstantEngine):
    """:class:`InstantEngine` whose ``/generate`` takes ``gen_ms`` (simulated generation) first."""

    def __init__(self, output_ids: list[int], gen_ms: float) -> None:
        super().__init__(output_ids)
        self.gen_s = gen_ms / 1000

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                length = next(
                    (int(x.split(":", 1)[1]) for x in lines[1:] if x.lower().startswith("content-length:")), 0
                )
                body = await reader.readexactly(length) if length else b""
                if path == "/generate" and self.gen_s:
                    await asyncio.sleep(self.gen_s)
                kind, data = self._answer(path, body)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: " + kind + b"\r\nContent-Length: "
                             + str(len(data)).encode() + b"\r\n\r\n" + data)  # fmt: skip
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def serve_engine(port: int, gen_ms: float) -> None:
    from dressage.tito import get_profile

    profile = get_profile("qwen3.5")
    engine = StubEngine([*profile.tokenizer.encode(CALL_TEXT), profile.stop_token_ids[0]], gen_ms)

    async def main() -> None:
        engine.server = await asyncio.start_server(engine._handle, "127.0.0.1", port, backlog=4096)
        await asyncio.Event().wait()

    asyncio.run(main())


# --- the agents (run in client processes) ------------------------------------------------------------


@dataclass
class AgentResult:
    turns: list[tuple[float, float, float]] = field(default_factory=list)
    """(proxied ms, direct ms, proxy's own x-dressage-overhead-ms) per turn."""
    tokens: int = 0
    generated: int = 0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)


async def agent(client: httpx.AsyncClient, base_url: str, engine: str, cfg: dict[str, Any],
                start: float, result: AgentResult) -> None:  # fmt: skip
    loop = ChatLoop()
    think = cfg["think_ms"] / 1000
    deadline = start + cfg["duration"]
    await asyncio.sleep(max(0.0, start - time.time()) + random.uniform(0, think))
    last = (0, 0)
    for turn in range(cfg["turns"]):
        if time.time() > deadline:
            break
        t0 = time.perf_counter()
        target = "proxy"
        try:
            for attempt in range(cfg["retries"] + 1):  # as the OpenAI/Anthropic SDKs do: 503 + Retry-After
                r = await client.post(base_url + "/chat/completions", json=loop.body(False))
                if r.status_code != 503 or "retry-after" not in r.headers or attempt == cfg["retries"]:
                    break
                result.errors["503 overloaded (retried after Retry-After)"] += 1
                await asyncio.sleep(float(r.headers["retry-after"]))
            proxied = (time.perf_counter() - t0) * 1000
            if r.status_code != 200:
                result.errors[f"HTTP {r.status_code}: {r.text[:300]}"] += 1
                break
            prompt = int(r.headers["x-dressage-prompt-tokens"])
            reply = r.json()
            completion = int(reply["usage"]["completion_tokens"])
            body = {
                "input_ids": [0] * prompt,
                "sampling_params": {"max_new_tokens": 64},
                "return_logprob": True,
            }
            t1 = time.perf_counter()
            target = "engine (direct)"
            await client.post(engine + "/generate", json=body)
            direct = (time.perf_counter() - t1) * 1000
        except httpx.HTTPError as e:
            result.errors[f"{type(e).__name__} from {target}"] += 1
            break
        result.turns.append((proxied, direct, float(r.headers.get("x-dressage-overhead-ms", "nan"))))
        last = (prompt, completion)
        result.generated += completion
        loop.extend(r.text, False, turn)
        if turn + 1 < cfg["turns"]:
            await asyncio.sleep(random.uniform(0, 2 * think))
    result.tokens += sum(last)  # the session's log: its last prompt plus the last reply (one segment)


def run_agents(spec_path: str) -> None:
    """A client process: run the agents of ``spec_path``; their results go to ``spec_path.out`` as JSON.

    (Not to stdout: thousands of turns overflow a pipe the parent reads only after the child exits.)
    """
    spec = json.loads(Path(spec_path).read_text())
    result = AgentResult()

    async def main() -> None:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None, keepalive_expiry=5.0)
        async with httpx.AsyncClient(timeout=spec["cfg"]["timeout"], limits=limits) as client:
            await asyncio.gather(*(agent(client, url, spec["engine"], spec["cfg"], spec["start"], result)
                                   for url in spec["sessions"]))  # fmt: skip

    asyncio.run(main())
    Path(spec_path + ".out").write_text(json.dumps({"turns": result.turns, "tokens": result.tokens, "generated": result.generated,
                      "errors": dict(result.errors)}))  # fmt: skip


# --- one measured level ------------------------------------------------------------------------------


async def open_sessions(proxies: list[str], run: str, k: int) -> list[str]:
    """K sessions, round-robin over the proxies; their OpenAI base URLs."""
    headers = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    sem = asyncio.Semaphore(32)
    async with httpx.AsyncClient(timeout=60, headers=headers) as client:
        await client.post(proxies[0] + "/admin/runs", json={"name": run, "config": {}})

        async def one(i: int) -> str:
            async with sem:
                r = await client.post(
                    proxies[i % len(proxies)] + "/admin/sessions", json={"run": run, "agent": "scale"}
                )
                if r.status_code != 200:
                    raise RuntimeError(f"opening a session: HTTP {r.status_code} {r.text[:500]}")
                return str(r.json()["base_url"])

        return list(await asyncio.gather(*(one(i) for i in range(k))))


def measure(args: argparse.Namespace, pg: Postgres, k: int, pooler: str) -> dict[str, Any]:
    from bench_db import fresh_database

    with contextlib.ExitStack() as stack:
        db = stack.enter_context(fresh_database(pg.admin))
        url = db.url
        if pooler != "none":
            mode = pooler.split("-", 1)[1]
            port = stack.enter_context(pgbouncer(pg, db.name, args.pgbouncer_pool, mode))
            url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/{db.name}"
        engine_port = free_port()
        engine_url = f"http://127.0.0.1:{engine_port}"
        py = sys.executable
        env = {"PYTHONPATH": str(ROOT)}
        engine = stack.enter_context(
            spawn([py, __file__, "serve-engine", str(engine_port), str(args.gen_ms)], env)
        )
        proxies, procs = [], []
        for _ in range(args.proxies):
            port = free_port()
            cmd = [py, "-c", "from dressage.cli import app; app()", "proxy", "--engine-url", engine_url,
                   "--port", str(port), "--database-url", url, "--log-level", "warning"]  # fmt: skip
            procs.append(stack.enter_context(spawn(cmd, {**env, "DRESSAGE_ADMIN_TOKEN": ADMIN_TOKEN})))
            proxies.append(f"http://127.0.0.1:{port}")
        wait_http(engine_url + "/model_info")
        for p in proxies:
            wait_http(p + "/health")
        run = f"scale-{k}-{pooler}"
        sessions = asyncio.run(open_sessions(proxies, run, k))
        start = time.time() + 3 + k / 2000  # the clients import and build their agents first
        cfg = {
            "turns": args.turns,
            "think_ms": args.think_ms,
            "duration": args.duration,
            "timeout": args.timeout,
            "retries": args.retries,
        }
        clients, specs = [], []
        for c in range(args.clients):
            spec = Path(tempfile.mkstemp(suffix=".json")[1])
            specs.append(spec)
            spec.write_text(json.dumps({"sessions": sessions[c :: args.clients], "engine": engine_url,
                                        "cfg": cfg, "start": start}))  # fmt: skip
            clients.append(subprocess.Popen([py, __file__, "agents", str(spec)],
                                            env={**os.environ, **env}))  # fmt: skip
        while time.time() < start:
            time.sleep(0.01)
        with psycopg.connect(db.conninfo, autocommit=True) as mon:
            lsn0 = mon.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]
            pg_cpu0 = pg.cpu(db.name)
            # the latest CPU of every process seen: a backend that exits keeps its last sample
            pg_seen = dict(pg_cpu0)
            client_cpu0 = sum(cpu_seconds(c.pid) for c in clients)
            proxy_cpu0 = sum(cpu_seconds(p.pid) for p in procs)
            engine_cpu0 = cpu_seconds(engine.pid)
            busy0, total0 = machine_busy()
            t0 = time.time()
            max_conns = 0
            client_cpu = 0.0
            while any(c.poll() is None for c in clients):
                n = mon.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                                (db.name,)).fetchone()[0]  # type: ignore[index]  # fmt: skip
                max_conns = max(max_conns, n)
                pg_seen.update(pg.cpu(db.name))
                client_cpu = sum(cpu_seconds(c.pid) for c in clients) - client_cpu0
                time.sleep(0.5)
            elapsed = time.time() - t0
            pg_seen.update(pg.cpu(db.name))
            pg_cpu = sum(v - pg_cpu0.get(pid, 0.0) for pid, v in pg_seen.items())
            proxy_cpu = sum(cpu_seconds(p.pid) for p in procs) - proxy_cpu0
            engine_cpu = cpu_seconds(engine.pid) - engine_cpu0
            busy1, total1 = machine_busy()
            wal = mon.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (lsn0,)).fetchone()[0]  # type: ignore[index]
            recorded, logged = mon.execute(  # what the log stores: context growth + generated, per turn
                "SELECT count(*), coalesce(sum(cardinality(context_ids) + cardinality(generated_ids)), 0) FROM turns"
            ).fetchone()  # type: ignore[misc]
        for c in clients:
            c.wait()
        outs = [json.loads(Path(f"{s}.out").read_text()) if Path(f"{s}.out").exists() else {} for s in specs]
        for spec in specs:  # the agents' inputs and results
            spec.unlink(missing_ok=True)
            Path(f"{spec}.out").unlink(missing_ok=True)
    turns = [t for o in outs for t in o.get("turns", [])]
    delivered = sum(o.get("tokens", 0) for o in outs)
    tokens = int(logged)
    errors: collections.Counter[str] = collections.Counter()
    for o in outs:
        errors.update(o.get("errors", {}))
    added = [p - d for p, d, _ in turns] or [float("nan")]
    busy = (busy1 - busy0) / max(1, total1 - total0) * os.cpu_count()  # type: ignore[operator]
    ours = pg_cpu + proxy_cpu + engine_cpu
    return {
        "k": k, "p": args.proxies, "pooler": pooler, "turns": len(turns), "recorded": recorded,
        "elapsed": elapsed, "tokens": tokens, "delivered_tokens": delivered, "generated": sum(o.get("generated", 0) for o in outs),
        "added_p50": statistics.median(added), "added_p99": pct(added, 99),
        "direct_p50": statistics.median([d for _, d, _ in turns] or [float("nan")]),
        "server_p50": statistics.median([o for _, _, o in turns] or [float("nan")]),
        "pg_cpu": pg_cpu, "proxy_cpu": proxy_cpu, "client_cpu": client_cpu, "wal": float(wal), "conns": max_conns,
        "errors": dict(errors), "busy_cores": busy, "ours_cores": ours / max(elapsed, 1e-9),
    }  # fmt: skip


def failed_row(args: argparse.Namespace, k: int, pooler: str, e: Exception) -> dict[str, Any]:
    """The row of a level that could not run: its error, no figures."""
    nan = float("nan")
    return {
        "k": k, "p": args.proxies, "pooler": pooler, "turns": 0, "recorded": 0, "elapsed": nan, "tokens": 0,
        "added_p50": nan, "added_p99": nan, "direct_p50": nan, "server_p50": nan, "pg_cpu": nan,
        "proxy_cpu": nan, "client_cpu": nan, "wal": nan, "conns": 0, "busy_cores": nan, "ours_cores": nan,
        "errors": {f"did not run: {e}"[:300]: 1},
    }  # fmt: skip


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=200)
    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), "?")  # fmt: skip
    console.print(f"machine: {os.cpu_count()} cores ({model}), load average {os.getloadavg()[0]:.2f} now; "
                  f"{args.proxies} proxies, {args.clients} client processes, stub engine {args.gen_ms:g} ms/turn, "
                  f"think {args.think_ms:g} ms (jittered 0-2x), {args.turns} turns/session, ~330 logged tokens/turn")  # fmt: skip
    t = Table(
        title="Dressage load model: K agent sessions, P proxies, one PostgreSQL (same-run direct-engine baseline)"
    )
    for col in ("K", "pooler", "turns (recorded)", "s", "turns/s", "tokens/s", "proxy-added p50/p99 ms",
                "direct p50 ms", "proxy own p50 ms", "PG CPU ms/1k tok", "WAL B/tok", "PG conns",
                "proxy CPU ms/1k tok", "machine busy / ours / clients (cores)", "errors"):  # fmt: skip
        t.add_column(col, justify="right" if col not in ("pooler", "errors") else "left")
    for r in rows:
        per_k = 1000 / max(r["tokens"], 1)
        t.add_row(
            str(r["k"]), r["pooler"], f"{r['turns']} ({r['recorded']})", f"{r['elapsed']:.1f}",
            f"{r['turns'] / r['elapsed']:.0f}", f"{r['tokens'] / r['elapsed']:,.0f}",
            f"{r['added_p50']:.1f} / {r['added_p99']:.1f}", f"{r['direct_p50']:.1f}", f"{r['server_p50']:.1f}",
            f"{r['pg_cpu'] * 1000 * per_k:.2f}", f"{r['wal'] / max(r['tokens'], 1):.2f}", str(r["conns"]),
            f"{r['proxy_cpu'] * 1000 * per_k:.2f}", f"{r['busy_cores']:.2f} / {r['ours_cores']:.2f} / {r['client_cpu'] / r['elapsed']:.2f}",
            ", ".join(f"{v}x {k[:60]}" for k, v in r["errors"].items()) or "0",
        )  # fmt: skip
    console.print(t)
    console.print("tokens = what the log stores (each turn's new context + generated ids, counted in the database); ours = PostgreSQL + proxies + engine CPU "
                  "(clients excluded); proxy-added = proxied turn minus a direct engine call of the same prompt length")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--sessions", default="100", help="Comma-separated K values (full model: 100,1000,5000)."
    )
    parser.add_argument("--proxies", type=int, default=2, help="P proxy processes.")
    parser.add_argument("--clients", type=int, default=2, help="Client processes running the agents.")
    parser.add_argument("--turns", type=int, default=4, help="Turns per session.")
    parser.add_argument("--think-ms", type=float, default=2000, help="Mean tool time between turns.")
    parser.add_argument(
        "--gen-ms", type=float, default=20, help="The stub engine's simulated generation time."
    )
    parser.add_argument(
        "--duration", type=float, default=60, help="No new turn starts after this many seconds."
    )
    parser.add_argument("--timeout", type=float, default=120, help="Client timeout per request.")
    parser.add_argument(
        "--retries", type=int, default=2, help="Retries of a 503 with Retry-After (the SDKs' default: 2)."
    )
    parser.add_argument(
        "--pooler",
        default="none",
        help="Comma-separated: none, pgbouncer-transaction, pgbouncer-session (each K runs once per pooler).",
    )
    parser.add_argument(
        "--pgbouncer-pool", type=int, default=20, help="PgBouncer server connections per database."
    )
    parser.add_argument("--pg-admin-url", default=None, help="Use this server instead of a private cluster.")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the cluster and processes on the way out
    ks = [int(x) for x in args.sessions.split(",") if x]
    poolers = [p for p in args.pooler.split(",") if p]
    if set(poolers) - {"none", "pgbouncer-transaction", "pgbouncer-session"}:
        parser.error(f"unknown pooler in {args.pooler!r}")
    rows = []
    with contextlib.ExitStack() as stack:
        if args.pg_admin_url:
            pg = Postgres(
                args.pg_admin_url,
                None,
                int(psycopg.conninfo.conninfo_to_dict(args.pg_admin_url).get("port") or 5432),
            )
        else:
            pg = stack.enter_context(private_postgres(max_connections=200 + 25 * args.proxies))
        for k in ks:
            for pooler in poolers:
                try:
                    rows.append(measure(args, pg, k, pooler))
                except (
                    Exception
                ) as e:  # a level that cannot run (e.g. PgBouncer refusing the store): report it
                    rows.append(failed_row(args, k, pooler, e))
                print(json.dumps(rows[-1]), file=sys.stderr)
    report(rows, args)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "serve-engine":
        serve_engine(int(sys.argv[2]), float(sys.argv[3]))
    elif len(sys.argv) > 1 and sys.argv[1] == "agents":
        run_agents(sys.argv[2])
    else:
        main()
