"""``dressage-worker fork`` of a real agent CLI's session, through the CLI's own dialect.

Codex (OpenAI Responses), Claude Code (Anthropic Messages), Qwen Code and mini-swe-agent (chat
completions), real CLIs in a bwrap sandbox without
network as in ``test_native_clis_rollout.py``, call the shell once, then answer from its output.
The session is forked at turn 1 into two branches: each branch's CLI starts in a fresh sandbox, its
first request is answered with the parent's recorded tool call (copied into the branch id for id,
no engine request), it runs the command again (the output it sends back, so its workspace, is the
parent's), and the answer is generated live with the branch's seed, which the CLI never sends: the
proxy takes it from the branch session's ``info["sampling_seed"]``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from dressage.tito import get_profile
from tests.agents.native_cli_harness import ToolThenAnswer, cli_run, require_cli
from tests.agents.test_native_clis_rollout import SUBMITS
from tests.rollout.conftest import open_store, requires_bwrap, start_worker, worker_env
from tests.scripted_engine import ScriptedEngine

pytestmark = [requires_bwrap, pytest.mark.slow]
SEED = 50
TOK = get_profile("qwen3.5").tokenizer


class _Policy(ToolThenAnswer):
    """Call the tool, then answer from its output and the request's seed; counts requests by phase."""

    def __init__(self, tool: str, arguments: dict[str, str]) -> None:
        super().__init__(tool, arguments, "parent")
        self.calls: list[tuple[str, str, Any]] = []

    def __call__(self, prompt: str, _n: int, sampling: Mapping[str, Any]) -> str:
        seed = sampling.get("sampling_seed")
        step, body = self.step(prompt, answer_prefix=f"seed {seed}, ")
        with self.lock:
            self.calls.append((self.phase, step, seed))
        return self.reply(prompt, body)


def _stable(ids: Any) -> str:
    """Decoded ids without the lines Codex makes up per run (its chunk id and wall time)."""
    text = TOK.decode([int(x) for x in ids])
    return re.sub(r"(Chunk ID|Wall time): [^\n]*\n", "", text)


def _fork(args: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from dressage.cli import main; main()", "fork", *args],
        cwd=home.parent,
        env=worker_env(home),
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("kind", ["codex", "claude_code", "qwen_code", "mini_swe_agent", "gemini_cli"])
def test_cli_session_forked_at_its_answer(tmp_path: Path, kind: str) -> None:
    tool, arguments, dialect = require_cli(kind)
    policy = _Policy(tool, arguments)
    policy.submit = kind in SUBMITS
    with ScriptedEngine(policy).running() as eng:
        cfg, db, home, name = cli_run(tmp_path, eng.url, kind, max_attempts=1, concurrency=2)
        first = start_worker(["--config", str(cfg), "--database-url", db], home)
        out = first.communicate(timeout=600)[0].decode(errors="replace")
        assert first.returncode == 0, out[-3000:]
        store = open_store(db, home)
        (parent,) = store.sessions.list(name)
        parent_turns = store.turns.read(session_id=parent.id, with_experts=False)
        assert [t.route for t in parent_turns] == ["create", "append"]

        policy.phase = "fork"
        forked = _fork(
            [parent.id, "--at-turn", "1", "--branches", "2", "--seed", str(SEED), "--database-url", db], home
        )
        assert forked.returncode == 0, forked.stdout[-3000:] + forked.stderr[-3000:]
    try:
        branches = [
            (s.status, s.error) for s in store.sessions.list(name) if s.parent_session_id == parent.id
        ]
        answered = sorted(c[2] for c in policy.calls if c[:2] == ("fork", "answer"))
        # A branch that diverged sent a first request other than the parent's: show the parent's
        # (its last part: the CLI's environment context and the task) to compare with the agent's.
        first = TOK.decode([int(x) for x in parent_turns[0].context_ids])[-1500:]
        assert answered == [SEED, SEED + 1], (policy.calls, branches, forked.stdout[-2000:], first)
        # Gemini CLI's directory tree raced the CLI's own start-up writes (see GeminiCliAgent).
        assert "Directory Structure" not in first
        assert not [c for c in policy.calls if c[:2] == ("fork", "call")]  # the tool call was copied
        children = [s for s in store.sessions.list(name) if s.parent_session_id == parent.id]
        assert len(children) == 2
        answers = set()
        for child in children:
            assert (child.status, child.reward, child.fork_turn) == ("finished", 1.0, 1)
            turns = store.turns.read(session_id=child.id, with_experts=False)
            assert len(turns) == 2 and turns[0].info["replayed_from"] == parent_turns[0].id
            for a, b in (
                (turns[0].context_ids, parent_turns[0].context_ids),
                (turns[0].generated_ids, parent_turns[0].generated_ids),
            ):
                assert a.tolist() == b.tolist()
            assert turns[0].logprobs.tolist() == parent_turns[0].logprobs.tolist()
            # The command's output the CLI sent back (turn 1's new context) is the parent's
            # (but for the chunk id and wall time Codex writes into it).
            assert _stable(turns[1].context_ids) == _stable(parent_turns[1].context_ids)
            response = _stable(turns[1].context_ids).rsplit("<tool_response>", 1)[-1]
            # the output alone (Codex, Claude Code), after "Output: " (Qwen Code), or in JSON (mini-swe-agent)
            assert re.search(r'^(Output: )?tool-ran-ok$|"output": "tool-ran-ok\\n"', response, re.M), response
            assert turns[1].info["dialect"] == dialect and "replayed_from" not in turns[1].info
            answers.add(tuple(turns[1].generated_ids.tolist()))
        assert len(answers) == 2  # each branch's own seed
    finally:
        store.close()
