"""In-flight trajectory resume with real worker processes: kill -9 halfway, ``--resume`` continues.

A coding agent (bwrap sandbox) works through a scripted engine; the worker is killed with SIGKILL
while it waits on the engine for step 3, three turns recorded. ``--resume`` takes the interrupted
session over: the engine generates nothing for the recorded steps (the proxy answers them from the
log, the agent re-runs its tools in a fresh sandbox), the rest is generated live on the same
session, and the finished trajectory equals an uninterrupted run's token for token.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.rollout.conftest import requires_bwrap
from tests.rollout.resume_harness import PLAN, CodingScript, crash_and_resume, uninterrupted
from tests.scripted_engine import ScriptedEngine

pytestmark = requires_bwrap
HOLD_AT = 3


class _Policy:
    """The engine's script, swappable per test (the engine is shared by the module)."""

    def __init__(self) -> None:
        self.script = CodingScript(phase="reference")

    def __call__(self, prompt: str, n: int, sampling: Mapping[str, Any]) -> str:
        return self.script(prompt, n, sampling)


@pytest.fixture(scope="module")
def scripted() -> Iterator[tuple[ScriptedEngine, _Policy]]:
    policy = _Policy()
    with ScriptedEngine(policy).running() as eng:
        yield eng, policy


@pytest.fixture(scope="module")
def reference(
    scripted: tuple[ScriptedEngine, _Policy], tmp_path_factory: pytest.TempPathFactory
) -> list[Any]:
    """The uninterrupted run's trajectory (the same task, sample and seed)."""
    eng, policy = scripted
    tmp = tmp_path_factory.mktemp("reference")
    traj = uninterrupted(tmp, f"sqlite:///{tmp / 'log.db'}", eng.url)
    assert len(traj) == len(PLAN) + 1
    assert policy.script.generated("reference")[0] == len(PLAN) + 1
    return traj


def test_kill_9_then_resume_continues_the_trajectory(
    tmp_path: Path, any_db_url: str, scripted: tuple[ScriptedEngine, _Policy], reference: list[Any]
) -> None:
    eng, policy = scripted
    script = policy.script = CodingScript(hold_at=HOLD_AT)
    out = crash_and_resume(tmp_path, any_db_url, script, eng.url)

    assert out.recorded_at_kill == HOLD_AT
    assert (out.prefix_requests, out.prefix_tokens) == (0, 0)  # nothing recorded is generated again
    assert out.live_requests == len(PLAN) + 1 - HOLD_AT
    assert out.trajectory == reference  # token-exact, the same segments and routes
    (session,) = out.sessions  # one session: no abandoned attempt, one trajectory for the trainer
    assert session.status == "finished" and session.attempt == 2 and session.reward == 1.0
    assert session.info["resume"] == {
        "attempt": 2, "from_attempt": 1, "seed_attempt": 1, "next_turn": HOLD_AT, "count": 1,
    }  # fmt: skip
    replay = session.info["replay"]
    assert replay["outcome"] == "completed" and replay["turns_replayed"] == HOLD_AT
    assert replay["tokens_replayed"] == sum(len(t[7]) for t in reference[:HOLD_AT])
    kinds = [(e.kind, e.session_id) for e in out.events]
    assert kinds == [("session_resumed", session.id), ("session_finalized", session.id)]


def test_kill_9_then_resume_on_the_image_provider(
    tmp_path: Path, scripted: tuple[ScriptedEngine, _Policy], test_image: Any
) -> None:
    """The same takeover with ``sandbox: {provider: image}``: the fresh sandbox of the resumed attempt
    runs over the same image (the cache is shared by both workers), re-runs the recorded tools and the
    trajectory equals an uninterrupted run on that image token for token."""
    eng, policy = scripted
    sandbox = {"provider": "image", "image": test_image.oci}
    env = {"DRESSAGE_CACHE_DIR": str(tmp_path / "cache")}
    policy.script = CodingScript(phase="reference")
    reference = uninterrupted(
        tmp_path / "ref", f"sqlite:///{tmp_path / 'ref.db'}", eng.url, sandbox=sandbox, env=env
    )
    assert len(reference) == len(PLAN) + 1
    script = policy.script = CodingScript(hold_at=HOLD_AT)
    db_url = f"sqlite:///{tmp_path / 'log.db'}"
    out = crash_and_resume(tmp_path / "crash", db_url, script, eng.url, sandbox=sandbox, env=env)
    assert out.recorded_at_kill == HOLD_AT
    assert (out.prefix_requests, out.prefix_tokens) == (0, 0)
    assert out.live_requests == len(PLAN) + 1 - HOLD_AT
    assert out.trajectory == reference
    (session,) = out.sessions
    assert session.status == "finished" and session.attempt == 2 and session.reward == 1.0
    assert session.sandbox == "image"
