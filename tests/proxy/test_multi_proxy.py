"""Any proxy serves any session: real ``dressage-worker proxy`` processes on one log.

Two (or three) proxy processes on loopback share one database (PostgreSQL; SQLite where a file
can be shared) and one scripted engine. A session's turns alternate between proxies and the log
is token-exact and dense; two proxies racing on one turn record it once (one 200, one 409); a
rollout worker spreading sessions over the proxies by consistent hashing completes with one proxy
killed mid-run, nothing lost or doubled.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import Request
from fastapi.responses import Response

from dressage.config import Settings
from dressage.errors import DressageError
from dressage.rollout.proxy_ring import HashRing
from dressage.store import EventStore, Turn
from dressage.store.db import upgrade
from dressage.tito import get_profile
from tests.proxy.conftest import ADMIN
from tests.scripted_engine import COUNT_TOOL, ScriptedEngine, logprob_of, qwen_tool_call

REPO = Path(__file__).resolve().parents[2]
NOTHINK = {"chat_template_kwargs": {"enable_thinking": False}}


def _reply(prompt: str, n: int, sampling: Mapping[str, Any]) -> str:
    """The scripted model: a tool call that depends only on the prompt (so sessions compare).

    Tool calls keep one user turn going, so the whole conversation is one token-contiguous segment.
    """
    return qwen_tool_call("count", n=prompt.count("<tool_response>"))


class GatedEngine(ScriptedEngine):
    """A scripted engine that, while ``gate`` is set, holds each request until ``gate`` have arrived."""

    def __init__(self) -> None:
        super().__init__(_reply)
        self.gate = 0
        self.arrived = 0

    async def _generate(self, request: Request) -> Response:
        if self.gate:
            self.arrived += 1
            deadline = time.monotonic() + 30
            while self.arrived < self.gate and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        return await super()._generate(request)


class ProxyProcess:
    """``dressage-worker proxy`` as a child process on a free port; ``url`` once it is healthy."""

    def __init__(self, db_url: str, engine_url: str, home: Path) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "DRESSAGE_HOME": str(home),
            "DRESSAGE_ADMIN_TOKEN": ADMIN,
        }
        env.pop("DRESSAGE_DATABASE_URL", None)
        args = [
            "--engine-url",
            engine_url,
            "--port",
            "0",
            "--database-url",
            db_url,
            "--context-window",
            "4096",
        ]
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from dressage.cli import main; main()",
                "proxy",
                *args,
                "--log-level",
                "warning",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.url = ""

    def wait_ready(self, timeout: float = 120) -> str:
        """Read the listening line from stderr, then wait for ``/health``."""
        assert self.proc.stderr is not None
        deadline = time.monotonic() + timeout
        seen: list[str] = []
        while not self.url:
            line = self.proc.stderr.readline().decode(errors="replace")
            seen.append(line)
            if not line:
                pytest.fail(f"proxy exited ({self.proc.wait()}) before listening:\n{''.join(seen)[-3000:]}")
            if line.startswith("proxy: "):
                self.url = line.split()[1]
            assert time.monotonic() < deadline, "proxy did not start"
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()  # drain
        while httpx.get(f"{self.url}/health").status_code != 200:
            time.sleep(0.05)
        return self.url

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def gated() -> Iterator[GatedEngine]:
    eng = GatedEngine()
    with eng.running():
        yield eng


def _start(db_url: str, engine_url: str, home: Path, n: int) -> list[ProxyProcess]:
    procs = [ProxyProcess(db_url, engine_url, home) for _ in range(n)]  # start together, then wait
    for p in procs:
        p.wait_ready()
    return procs


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def shared(
    request: pytest.FixtureRequest, gated: GatedEngine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[list[str], EventStore]]:
    """Two proxy processes on one database, and a store on it for the test's checks."""
    home = tmp_path_factory.mktemp("multi-proxy")
    if request.param == "postgresql":
        db_url = str(request.getfixturevalue("pg_url"))
    else:
        db_url = f"sqlite:///{home / 'log.db'}"
        upgrade(db_url)
    procs = _start(db_url, gated.url, home, 2)
    store = EventStore.open(settings=Settings(database_url=db_url, home=home), auto_upgrade=False)
    try:
        yield [p.url for p in procs], store
    finally:
        store.close()
        for p in procs:
            p.kill()


def _admin(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(url + path, json=body, headers={"authorization": f"Bearer {ADMIN}"}, timeout=60)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def _session(urls: list[str]) -> tuple[str, str, str]:
    run = f"run-{uuid.uuid4().hex[:8]}"
    _admin(urls[0], "/admin/runs", {"name": run, "config": {}})
    s = _admin(urls[0], "/admin/sessions", {"run": run})
    return run, s["session_id"], s["token"]


def _chat(url: str, token: str, messages: list[dict[str, Any]]) -> httpx.Response:
    return httpx.post(
        f"{url}/s/{token}/v1/chat/completions",
        json={"model": "m", "messages": messages, "tools": [COUNT_TOOL], "max_tokens": 64, **NOTHINK},
        timeout=60,
    )


def _next(messages: list[dict[str, Any]], reply: dict[str, Any], k: int) -> list[dict[str, Any]]:
    """The conversation after ``reply`` (a tool call) and its tool result."""
    call = reply["tool_calls"][0]
    return [*messages, reply, {"role": "tool", "tool_call_id": call["id"], "content": f"counted {k}"}]


def _converse(urls: list[str], token: str, turns: int) -> list[list[Any]]:
    """``turns`` tool-call steps, request ``k`` to ``urls[k % len(urls)]``; the calls' arguments."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Count with me."}]
    calls = []
    for k in range(turns):
        r = _chat(urls[k % len(urls)], token, messages)
        assert r.status_code == 200, r.text
        reply = r.json()["choices"][0]["message"]
        calls.append([(c["function"]["name"], c["function"]["arguments"]) for c in reply["tool_calls"]])
        messages = _next(messages, reply, k)
    return calls


def _assert_dense(turns: list[Turn], n: int) -> None:
    """Turn indexes 0..n-1, one segment, each turn starting where the previous one ended."""
    assert [t.turn_index for t in turns] == list(range(n))
    assert [t.route for t in turns] == ["create"] + ["append"] * (n - 1)
    assert {t.segment_index for t in turns} == {0}
    end = 0
    for t in turns:
        assert t.segment_offset == end
        end += t.context_ids.size + t.generated_ids.size


def test_turns_alternate_between_proxies_token_exact_and_dense(
    shared: tuple[list[str], EventStore],
) -> None:
    urls, store = shared
    _, alternating, token_a = _session(urls)
    calls = _converse(urls, token_a, 5)  # A, B, A, B, A: each proxy's cache goes stale in turn
    assert [c[0][1] for c in calls] == [f'{{"n": {k}}}' for k in range(5)]
    _, single, token_s = _session(urls)
    assert _converse(urls[:1], token_s, 5) == calls  # the same conversation on one proxy

    got, want = store.turns.read(session_id=alternating), store.turns.read(session_id=single)
    _assert_dense(got, 5)
    _assert_dense(want, 5)
    tokenizer = get_profile("qwen3.5").tokenizer
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.context_ids.tolist() == w.context_ids.tolist()
        assert g.generated_ids.tolist() == w.generated_ids.tolist()
        assert g.logprobs.tolist() == pytest.approx([logprob_of(int(i)) for i in g.generated_ids])
        assert tokenizer.decode([int(i) for i in g.generated_ids]).startswith(qwen_tool_call("count", n=k))


def test_two_proxies_racing_on_one_turn_record_it_once(
    shared: tuple[list[str], EventStore], gated: GatedEngine
) -> None:
    urls, store = shared
    run, sid, token = _session(urls)
    again = httpx.post(  # a caller-chosen session id is opened once: its token was handed out
        urls[1] + "/admin/sessions",
        json={"run": run, "session_id": sid},
        headers={"authorization": f"Bearer {ADMIN}"},
    )
    assert again.status_code == 409 and again.json()["error"]["code"] == "session_exists"
    first = [{"role": "user", "content": "Race me."}]
    r0 = _chat(urls[0], token, first)
    assert r0.status_code == 200
    messages = _next(first, r0.json()["choices"][0]["message"], 0)

    results: dict[int, httpx.Response] = {}

    def send(i: int) -> None:
        results[i] = _chat(urls[i], token, messages)

    gated.arrived, gated.gate = 0, 2  # both generations run before either is recorded
    try:
        threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=90)
    finally:
        gated.gate = 0
    statuses = sorted(r.status_code for r in results.values())
    assert statuses == [200, 409], [r.text for r in results.values()]
    loser = next(i for i, r in results.items() if r.status_code == 409)
    winner = results[1 - loser]
    assert results[loser].json()["error"]["code"] == "turn_conflict"
    turns = store.turns.read(session_id=sid)
    _assert_dense(turns, 2)  # one row for turn 1, not two
    # The loser's retry is answered from the log: the winner's reply, nothing new recorded.
    retry = _chat(urls[loser], token, messages)
    assert retry.status_code == 200
    assert retry.json()["choices"][0]["message"] == winner.json()["choices"][0]["message"]
    assert len(store.turns.read(session_id=sid)) == 2


def test_hash_ring_keeps_sessions_and_moves_only_a_dead_proxys_share() -> None:
    urls = [f"http://127.0.0.1:{9000 + i}" for i in range(4)]
    ring = HashRing(urls)
    keys = [uuid.uuid4().hex for _ in range(4000)]
    owners = {k: ring.walk(k)[0] for k in keys}
    share = Counter(owners.values())
    assert set(share) == set(urls) and min(share.values()) > 600  # each near 1000 of 4000
    assert all(sorted(ring.walk(k)) == sorted(urls) for k in keys[:50])  # every proxy once
    smaller = HashRing(urls[1:])
    for k in keys:  # removing a proxy moves its sessions to their next proxy, and nothing else
        expected = ring.walk(k)[1] if owners[k] == urls[0] else owners[k]
        assert smaller.walk(k)[0] == expected


def test_rollout_over_proxies_survives_killing_one(tmp_path: Path, pg_url: str, gated: GatedEngine) -> None:
    from tests.paddock.conftest import bwrap_unavailable_reason
    from tests.rollout.conftest import start_worker, write_config, write_tasks

    if bwrap_unavailable_reason() is not None:
        pytest.skip(str(bwrap_unavailable_reason()))
    home = tmp_path / "home"
    procs = _start(pg_url, gated.url, home, 2)
    store = EventStore.open(settings=Settings(database_url=pg_url, home=home), auto_upgrade=False)
    try:
        n_tasks = 6
        write_tasks(
            tmp_path / "tasks.jsonl", [{"prompt": f"Task {i}.", "label": "x"} for i in range(n_tasks)]
        )
        cfg = write_config(
            tmp_path,
            gated.url,
            n_samples_per_prompt=1,
            agent={"kind": "python", "path": "tests.rollout.agents_for_tests:multi_turn"},
            proxy={"urls": [p.url for p in procs]},
            worker={"concurrency": 3, "lease_s": 10, "max_attempts": 3},
        )
        import yaml

        run = yaml.safe_load(cfg.read_text())["run"]
        worker = start_worker(
            ["--config", str(cfg), "--database-url", pg_url],
            home,
            DRESSAGE_ADMIN_TOKEN=ADMIN,
            DRESSAGE_TEST_AGENT_SLEEP="0.3",
        )

        ring = HashRing([p.url for p in procs])

        def moving_session() -> str | None:
            """A running session owned by proxy 0 on the ring, part-way through its turns."""
            try:
                r = store.runs.get(run)
                for s in store.sessions.list(r, status="running"):
                    n = len(store.turns.read(session_id=s.id, with_experts=False))
                    if ring.walk(s.id)[0] == procs[0].url and 1 <= n < 4:
                        return s.id
            except DressageError:
                return None
            return None

        deadline = time.monotonic() + 120
        moved = None
        while moved is None and time.monotonic() < deadline and worker.poll() is None:
            moved = moving_session()
            time.sleep(0.05)
        assert moved is not None, worker.communicate()[0].decode(errors="replace")[-3000:]
        procs[0].kill()  # mid-run: this session (and maybe others) must move to proxy 1
        out, _ = worker.communicate(timeout=180)
        assert worker.returncode == 0, out.decode(errors="replace")[-3000:]

        r = store.runs.get(run)
        sessions = store.sessions.list(r)
        finished = [s for s in sessions if s.status == "finished"]
        assert sorted(Counter(s.task_id for s in finished).values()) == [1] * n_tasks
        assert store.tasks.counts(r) == {"pending": 0, "leased": 0, "done": n_tasks, "failed": 0}
        for s in finished:  # every turn once, in order: nothing lost, nothing recorded twice
            _assert_dense(store.turns.read(session_id=s.id, with_experts=False), 4)
        assert moved in {s.id for s in finished}  # the session on the killed proxy finished on the other
    finally:
        store.close()
        for p in procs:
            p.kill()


def test_a_session_resumed_through_another_proxys_admin_api_replays_from_the_log(
    shared: tuple[list[str], EventStore],
) -> None:
    """In-flight resume with standalone proxies: attempt 2 takes the session over on proxy B
    (``POST /admin/sessions/{id}/resume``); the old token stops working on every proxy, the recorded
    turns come back from the log (no new rows) and the next turn is live on the same segment."""
    urls, store = shared
    _, sid, token = _session(urls)
    first = _converse(urls[:1], token, 2)
    out = _admin(urls[1], f"/admin/sessions/{sid}/resume", {"attempt": 2})
    assert out["session_id"] == sid and out["token"] != token
    for url in urls:
        assert _chat(url, token, [{"role": "user", "content": "Count with me."}]).status_code == 401

    messages: list[dict[str, Any]] = [{"role": "user", "content": "Count with me."}]
    replayed = []
    for k in range(3):
        r = _chat(urls[(k + 1) % 2], out["token"], messages)
        assert r.status_code == 200, r.text
        replayed.append(r.headers.get("x-dressage-replayed"))
        reply = r.json()["choices"][0]["message"]
        messages = _next(messages, reply, k)
    assert replayed == ["resume", "resume", None]
    assert [c[0][1] for c in first] == ['{"n": 0}', '{"n": 1}']
    _assert_dense(store.turns.read(session_id=sid), 3)
    bad = httpx.post(
        urls[0] + f"/admin/sessions/{sid}/resume",
        json={"attempt": "two"},
        headers={"authorization": f"Bearer {ADMIN}"},
    )
    assert bad.status_code == 400 and "attempt" in bad.text


@pytest.mark.skipif(not (shutil.which("curl") and shutil.which("jq")), reason="curl and jq are needed")
def test_blackbox_agents_without_network_reach_their_sessions_proxy_on_the_ring(
    tmp_path: Path, pg_url: str, gated: GatedEngine
) -> None:
    """The example's curl+jq agent in bwrap with network off, its worker on two standalone proxies:
    each sandbox reaches its own session's proxy through a per-session socket (a session opened on
    the second proxy too), every turn recorded once."""
    import yaml

    from tests.paddock.conftest import bwrap_unavailable_reason
    from tests.rollout.conftest import start_worker, write_config, write_tasks

    if bwrap_unavailable_reason() is not None:
        pytest.skip(str(bwrap_unavailable_reason()))
    home = tmp_path / "home"
    procs = _start(pg_url, gated.url, home, 2)
    store = EventStore.open(settings=Settings(database_url=pg_url, home=home), auto_upgrade=False)
    try:
        example = yaml.safe_load((REPO / "examples" / "blackbox.yaml").read_text())
        write_tasks(tmp_path / "tasks.jsonl", [{"prompt": f"Task {i}.", "label": "x"} for i in range(6)])
        cfg = write_config(
            tmp_path,
            gated.url,
            agent=example["agent"],
            sandbox={"network": False},
            proxy={"urls": [p.url for p in procs]},
        )
        run = yaml.safe_load(cfg.read_text())["run"]
        worker = start_worker(
            ["--config", str(cfg), "--database-url", pg_url], home, DRESSAGE_ADMIN_TOKEN=ADMIN
        )
        out, _ = worker.communicate(timeout=240)
        assert worker.returncode == 0, out.decode(errors="replace")[-3000:]
        sessions = store.sessions.list(store.runs.get(run))
        assert len(sessions) == 12 and {s.status for s in sessions} == {"finished"}, [
            s.error for s in sessions
        ]
        ring = HashRing([p.url for p in procs])
        assert {ring.walk(s.id)[0] for s in sessions} == {p.url for p in procs}  # 12 sessions: both owners
        for s in sessions:
            turns = store.turns.read(session_id=s.id, with_experts=False)
            assert len(turns) == 1 and turns[0].generated_ids.size > 0
    finally:
        store.close()
        for p in procs:
            p.kill()
