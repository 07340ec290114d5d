"""Sandbox checkpoints benchmark: bytes stored per turn, checkpoint time per turn, resume at turn K.

Three measurements, all client-side, baselines measured in the same run (docs/scale.md, "Checkpoints"):

1. **Bytes and capture time per turn** (in-process, a real bwrap sandbox and a real SQLite log):
   the worker's own turn hook (:class:`~dressage.rollout.checkpointing.SessionCheckpoints`) is
   called once per turn after the turn's tool call, as the proxy calls it at request K. Two trees:

   * ``coding``: a scripted coding session (the resume bench's plan, one tool call a turn: write a
     module, run it with ``python3``, write its test, run it, read it, ``ls``; each round of six
     turns with its own file names), from an empty workspace;
   * ``repo``: a generated repository (deterministic: source-like text files plus some binaries,
     ``--repo-mb``, 50 MB in the full run) in the workspace; each turn edits three files in place
     (``sed -i``), appends to one and writes a new small one.

   Per turn: bytes newly stored in the blob store (file blobs, the manifest and the request; the
   manifest on its own too), the hook's time (capture: walk, read and hash what changed, store the
   blobs and record the row), the tool call's time, and the hook's share of ``tool + hook``. Turn 0
   (cold: the whole tree is read and stored) is reported apart from turns 1.. (warm).

2. **The whole turn with a worker** (``dressage-worker rollout`` processes, the coding agent, a
   scripted engine on loopback): a ``--turns``-turn session with ``checkpoints: {keep: all}`` and
   the same session without (the baseline), two of each in the order baseline, checkpoints,
   checkpoints, baseline; the session's wall time (opened to finished) per turn in each, and what
   checkpoints add to the run's blob store per turn (with the agent's real request bodies).

3. **Resume at turn K** of those sessions (each checkpointed one is forked once): ``dressage-worker fork SESSION --at-turn K`` with
   ``--from-checkpoint`` (the default) against ``--replay`` (the agent re-runs every tool call,
   the proxy answers the recorded turns from the log): the fork command's wall time (a process
   start included) and its branch session's (opened to finished), the tool
   calls the branch ran (lines of its ``calls.txt``, which every tool call appends a nanosecond
   clock to, that its parent's does not hold) and its engine requests.

    python bench/checkpoints.py --quick          # a short run (the default sizes are the full run)
    python bench/checkpoints.py [--turns 50 --at-turn 40 --repo-mb 50]

No timing is asserted anywhere; the figures are what this machine gave.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import random
import statistics
import sys
import tarfile
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.rollout harnesses

from dressage.paddock import Sandbox, SandboxSpec
from dressage.paddock.bwrap import BwrapProvider
from dressage.proxy.contract import TurnRequest
from dressage.rollout.checkpointing import SessionCheckpoints
from dressage.rollout.config import CheckpointsConfig
from dressage.store import EventStore
from dressage.store.artifacts import LocalBlobStore
from tests.rollout.conftest import open_store, start_worker
from tests.rollout.fork_harness import finish, parent_config, start_fork
from tests.rollout.resume_harness import PLAN
from tests.scripted_engine import ScriptedEngine, qwen_tool_call

SPEC = SandboxSpec(memory_mb=None, max_processes=None, limits=("cgroup", "rlimit", "none"), timeout_s=60)
MB = 1_000_000
WORDS = (
    "def class return self import from for while if else elif try except with as yield lambda "
    "value index count total result items config request response buffer parse render update "
    "session worker store event token turn sample prompt reward policy"
).split()


def pct(xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` (nearest rank)."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def spread(xs: list[float], unit: str, scale: float = 1.0) -> str:
    """``p50 / p99 / max`` of ``xs`` (times ``scale``) with ``unit``."""
    v = [x * scale for x in xs]
    return f"{pct(v, 0.5):.1f} / {pct(v, 0.99):.1f} / {max(v):.1f} {unit}"


def blob_bytes(root: Path) -> int:
    """Bytes of every blob file under ``root`` (apparent sizes)."""
    total = 0
    for dirpath, _, names in os.walk(root):
        total += sum(os.path.getsize(os.path.join(dirpath, n)) for n in names if not n.startswith(".tmp-"))
    return total


def generate_repo(root: Path, size_mb: int, seed: int = 38) -> int:
    """A deterministic repository of about ``size_mb`` MB: 80% source-like text files of 2-40 kB in
    nested packages, 20% binaries of 256 kB - 2 MB; returns its bytes."""
    rng = random.Random(seed)
    lines = [
        "    " * rng.randint(0, 3) + " ".join(rng.choices(WORDS, k=rng.randint(2, 12))) + "\n"
        for _ in range(4000)
    ]
    total, i = 0, 0
    while total < size_mb * MB * 0.8:
        folder = root / "src" / f"pkg{i % 40}" / f"sub{i % 7}"
        folder.mkdir(parents=True, exist_ok=True)
        text = "".join(rng.choices(lines, k=rng.randint(40, 800)))
        (folder / f"mod{i}.py").write_text(text)
        total, i = total + len(text), i + 1
    j = 0
    while total < size_mb * MB:
        (root / "assets").mkdir(exist_ok=True)
        data = rng.randbytes(rng.randint(256 * 1024, 2 * 1024 * 1024))
        (root / "assets" / f"blob{j}.bin").write_bytes(data)
        total, j = total + len(data), j + 1
    return total


def repo_edit(turn: int, files: list[str]) -> str:
    """Turn ``turn``'s tool call on the repository: three files edited in place, one appended to,
    one new small file."""
    rng = random.Random(turn)
    a, b, c, d = rng.sample(files, 4)
    return (
        f"sed -i 's/value/value_{turn}/g' {a} && sed -i 's/token/tok{turn}/' {b} && sed -i '1d' {c} && "
        f"echo '# turn {turn}' >> {d} && printf 'x = {turn}\\n' > src/new_{turn}.py"
    )


async def coding_step(sandbox: Sandbox, turn: int) -> None:
    """Turn ``turn`` of the scripted coding session (:data:`PLAN`, one round of six turns per name)."""
    name, args = PLAN[turn % len(PLAN)]
    r = turn // len(PLAN)
    sub = {"fib.py": f"fib{r}.py", "test_fib.py": f"test_fib{r}.py", "import fib": f"import fib{r} as fib"}
    if name == "file_write":
        content = str(args["content"])
        for old, new in sub.items():
            content = content.replace(old, new)
        await sandbox.write_file(sub[str(args["path"])], content)
        return
    if name == "file_read":
        cmd = f"cat fib{r}.py"
    else:
        cmd = str(args["cmd"])
        for old, new in sub.items():
            cmd = cmd.replace(old, new)
    result = await sandbox.exec(cmd)
    if not result.ok:
        raise RuntimeError(f"turn {turn}: {cmd!r} failed: {result.stderr}")


@dataclass
class TurnCosts:
    """Per turn: bytes newly stored (all, manifest), the hook's time, the tool call's time."""

    stored: list[int] = field(default_factory=list)
    manifest: list[int] = field(default_factory=list)
    hook_s: list[float] = field(default_factory=list)
    tool_s: list[float] = field(default_factory=list)


async def per_turn(tree: str, turns: int, repo_mb: int, tmp: Path) -> TurnCosts:
    """Run ``turns`` turns on ``tree`` with the turn hook after each; their costs (module docstring)."""
    store = open_store(f"sqlite:///{tmp / 'log.db'}", tmp / "home")
    provider = BwrapProvider(root_dir=tmp / "sandboxes")
    costs = TurnCosts()
    try:
        run = store.runs.create(f"bench-{tree}")
        sid = store.sessions.open(run.name).id
        blobs = store.artifacts.blobs
        assert isinstance(blobs, LocalBlobStore)
        async with await provider.create(sid, SPEC) as sandbox:
            files: list[str] = []
            if tree == "repo":
                ws = sandbox.writable_roots()["workspace"]
                generate_repo(ws, repo_mb)
                files = sorted(str(p.relative_to(ws)) for p in (ws / "src").rglob("*.py"))
            hook = await SessionCheckpoints.for_session(
                store, run, sid, sandbox, CheckpointsConfig(keep="all"), []
            )
            for turn in range(turns):
                t0 = time.perf_counter()
                if tree == "repo":
                    result = await sandbox.exec(repo_edit(turn, files))
                    if not result.ok:
                        raise RuntimeError(result.stderr)
                else:
                    await coding_step(sandbox, turn)
                t1 = time.perf_counter()
                before = blob_bytes(blobs.root)
                t2 = time.perf_counter()
                await hook(_request(turn))
                t3 = time.perf_counter()
                costs.stored.append(blob_bytes(blobs.root) - before)
                found = store.sandbox_checkpoints.get(sid, turn)
                assert found is not None, f"no checkpoint at turn {turn}"
                costs.manifest.append(len(store.sandbox_checkpoints.read_manifest(found)))
                costs.tool_s.append(t1 - t0)
                costs.hook_s.append(t3 - t2)
    finally:
        store.close()
    return costs


def _request(turn: int) -> TurnRequest:
    """Request ``turn`` of the agent (a chat body of ``turn + 1`` messages)."""
    msgs = [{"role": "user" if k % 2 == 0 else "assistant", "content": f"step {k}"} for k in range(turn + 1)]
    return TurnRequest(turn, "chat", orjson.dumps({"model": "m", "messages": msgs}), f"{turn:064x}")


def report_turns(tree: str, costs: TurnCosts) -> None:
    """Print one tree's per-turn figures: turn 0 (cold) apart from the rest (warm)."""
    warm = slice(1, None)
    share = [h / (h + t) for h, t in zip(costs.hook_s[warm], costs.tool_s[warm], strict=True)]
    print(f"\n[{tree}] {len(costs.stored)} turns")
    print(
        f"  turn 0 (cold): stored {costs.stored[0] / 1e6:.2f} MB (manifest {costs.manifest[0] / 1e3:.1f} kB), "
        f"checkpoint {costs.hook_s[0] * 1e3:.0f} ms, tool call {costs.tool_s[0] * 1e3:.0f} ms"
    )
    print(
        f"  turns 1.. (warm): stored per turn p50 {pct(costs.stored[warm], 0.5) / 1e3:.1f} kB, "
        f"mean {statistics.mean(costs.stored[warm]) / 1e3:.1f} kB, max {max(costs.stored[warm]) / 1e3:.1f} kB "
        f"(manifest p50 {pct(costs.manifest[warm], 0.5) / 1e3:.1f} kB)"
    )
    print(f"  checkpoint time p50 / p99 / max: {spread(costs.hook_s[warm], 'ms', 1e3)}")
    print(f"  tool call time  p50 / p99 / max: {spread(costs.tool_s[warm], 'ms', 1e3)}")
    print(
        f"  checkpoint share of (tool + checkpoint): p50 {pct(share, 0.5):.0%}, p99 {pct(share, 0.99):.0%}; "
        f"checkpoint / tool ratio p50 {pct(costs.hook_s[warm], 0.5) / pct(costs.tool_s[warm], 0.5):.2f}x"
    )


@dataclass
class CounterScript:
    """The engine's policy: one tool call per step, appending ``call<step>-<ns clock>`` to ``calls.txt``
    (its printed output is deterministic, so a replay reproduces every prompt); counts requests by phase."""

    phase: str = "parent"
    calls: list[tuple[str, int]] = field(default_factory=list)

    def __call__(self, prompt: str, n: int, sampling: Mapping[str, Any]) -> str:
        step = prompt.count("<tool_response>")
        self.calls.append((self.phase, step))
        cmd = f"echo call{step}-$(date +%s%N) >> calls.txt && printf 'x = {step}\\n' > m{step}.py && echo step {step}"
        return qwen_tool_call("shell_exec", cmd=cmd)

    def count(self, phase: str) -> int:
        """Engine requests of ``phase``."""
        return sum(1 for p, _ in self.calls if p == phase)


def _calls(store: EventStore, run: str, session_id: str) -> list[str]:
    """The lines of the session's archived ``calls.txt``."""
    (ref,) = [a for a in store.artifacts.list(run, session_id=session_id) if a.name == "workspace.tar.gz"]
    with tarfile.open(fileobj=io.BytesIO(store.artifacts.get(ref)), mode="r:gz") as tar:
        member = tar.extractfile("./calls.txt")
        assert member is not None
        return member.read().decode().splitlines()


def record_session(tmp: Path, engine_url: str, turns: int, checkpoints: bool) -> tuple[str, str, float, int]:
    """One ``turns``-turn coding session through a worker; (run, session id, session wall seconds,
    bytes of its blob store)."""
    tmp.mkdir(parents=True, exist_ok=True)
    sections: dict[str, Any] = {"agent": {"kind": "coding", "max_turns": turns}}
    sections["sampling"] = {"max_tokens": 256, "enable_thinking": False, "seed": 1, "temperature": 0}
    sections["worker"] = {"concurrency": 1, "lease_s": 30, "max_attempts": 1, "session_timeout_s": 600}
    if checkpoints:
        sections["checkpoints"] = {"keep": "all"}
    cfg = parent_config(tmp, engine_url, **sections)
    db = f"sqlite:///{tmp / 'log.db'}"
    finish(start_worker(["--config", str(cfg), "--database-url", db], tmp / "home"), timeout=1200)
    run = yaml.safe_load(cfg.read_text())["run"]
    store = open_store(db, tmp / "home")
    try:
        (session,) = store.sessions.list(run, status="finished")
        assert session.finished_at is not None
        blobs = store.artifacts.blobs
        assert isinstance(blobs, LocalBlobStore)
        return run, session.id, session.finished_at - session.created_at, blob_bytes(blobs.root)
    finally:
        store.close()


def fork_once(tmp: Path, run: str, parent: str, at: int, script: CounterScript, mode: str) -> dict[str, Any]:
    """``dressage-worker fork PARENT --at-turn AT --<mode>``: wall, tool calls and engine requests."""
    script.phase = mode
    db = f"sqlite:///{tmp / 'log.db'}"
    t0 = time.perf_counter()
    finish(
        start_fork([parent, "--at-turn", str(at), f"--{mode}", "--database-url", db], tmp / "home"),
        timeout=1200,
    )
    wall = time.perf_counter() - t0
    store = open_store(db, tmp / "home")
    try:
        child = max(store.sessions.children(parent), key=lambda c: c.created_at)  # this fork's branch
        parent_calls = set(_calls(store, run, parent))
        ran = [c for c in _calls(store, run, child.id) if c not in parent_calls]
        start = child.info.get("start", {})
        session_s = (child.finished_at or child.created_at) - child.created_at
        out = {"wall": wall, "session": session_s, "tools": len(ran), "requests": script.count(mode)}
        return {**out, "path": start.get("path")}
    finally:
        store.close()


def whole_turn_and_resume(tmp: Path, turns: int, at: int) -> None:
    """Measurements 2 and 3 (module docstring). Sessions in the order baseline, checkpoints,
    checkpoints, baseline (the first session of a run pays for cold caches); a session is forked
    once at a turn, so each fork mode forks its own checkpointed session."""
    script = CounterScript()
    walls: dict[bool, list[float]] = {False: [], True: []}
    stored: dict[bool, list[int]] = {False: [], True: []}
    parents: list[tuple[Path, str, str]] = []
    with ScriptedEngine(script).running() as eng:
        for i, checkpoints in enumerate((False, True, True, False)):
            script.phase = f"session{i}"
            run, sid, wall, blob_total = record_session(tmp / f"s{i}", eng.url, turns, checkpoints)
            walls[checkpoints].append(wall / turns)
            stored[checkpoints].append(blob_total)
            if checkpoints:
                parents.append((tmp / f"s{i}", run, sid))
        print(
            f"\n[worker, scripted engine] a {turns}-turn coding session (bwrap), session wall per turn (2 each):"
        )
        base, with_ck = statistics.mean(walls[False]), statistics.mean(walls[True])
        print(
            f"  no checkpoints {' / '.join(f'{w * 1e3:.0f}' for w in walls[False])} ms, "
            f"checkpoints keep=all {' / '.join(f'{w * 1e3:.0f}' for w in walls[True])} ms "
            f"(mean {with_ck / base:.2f}x the baseline)"
        )
        extra = (statistics.mean(stored[True]) - statistics.mean(stored[False])) / turns
        print(
            f"  blob store: {statistics.mean(stored[False]) / 1e3:.0f} kB without, "
            f"{statistics.mean(stored[True]) / 1e3:.0f} kB with checkpoints: {extra / 1e3:.1f} kB per turn "
            f"(the real requests' bodies included)"
        )
        modes = ("replay", "from-checkpoint")
        rows = [fork_once(*parent, at, script, m) for parent, m in zip(parents, modes, strict=True)]
    replay, ck = rows
    print(f"\n[resume at turn {at} of {turns}] dressage-worker fork --at-turn {at}, one branch:")
    for mode, r in (("--replay", replay), ("--from-checkpoint", ck)):
        print(
            f"  {mode:<18} command wall {r['wall']:.2f} s (branch session {r['session']:.2f} s), "
            f"tool calls run {r['tools']}, "
            f"engine requests {r['requests']}, info.start.path {r['path']}"
        )
    print(
        f"  from-checkpoint / replay: command wall {ck['wall'] / replay['wall']:.2f}x, "
        f"branch session {ck['session'] / replay['session']:.2f}x"
    )


def main() -> None:
    """Run the three measurements and print their figures."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="a short run: 10 turns, resume at 8, a 5 MB repository"
    )
    ap.add_argument("--turns", type=int, default=50)
    ap.add_argument("--at-turn", type=int, default=40)
    ap.add_argument("--repo-mb", type=int, default=50)
    ap.add_argument(
        "--skip", choices=("bytes", "resume"), action="append", default=[], help="leave a part out"
    )
    args = ap.parse_args()
    if args.quick:
        args.turns, args.at_turn, args.repo_mb = 10, 8, 5
    print(f"load average at start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    with tempfile.TemporaryDirectory(prefix="dressage-ckbench-") as d:
        tmp = Path(d)
        if "bytes" not in args.skip:
            for tree in ("coding", "repo"):
                label = f"repo {args.repo_mb} MB" if tree == "repo" else "coding session"
                costs = asyncio.run(per_turn(tree, args.turns, args.repo_mb, tmp / tree))
                report_turns(label, costs)
        if "resume" not in args.skip:
            whole_turn_and_resume(tmp / "worker", args.turns, args.at_turn)
    print(f"\nload average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
