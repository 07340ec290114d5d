"""Every broken config, dataset and option of the hardening run: one line naming the field, exit code
1, and nothing created (no database file, no run, no output directory).

The commands run in-process through typer's runner; each case gets a fresh directory holding a
valid ``run.yaml`` and ``tasks.jsonl`` that the case then breaks in one place.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from dressage.cli import app
from dressage.commandline import EXIT_ERROR
from dressage.config import Settings
from dressage.store import EventStore

VALID_ROW = {"prompt": "Say e.", "label": "e"}


def _config(**sections: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "run": "broken",
        "dataset": {"path": "tasks.jsonl"},
        "engine": {"kind": "dev", "model": "tiny"},
        "agent": {"kind": "answer"},
    }
    cfg.update(sections)
    return cfg


ROLLOUT_CASES: list[tuple[str, dict[str, Any], list[dict[str, Any]] | str, str]] = [
    # (case id, config, dataset rows (or raw text), text the one error line must contain)
    (
        "engine-model-missing",
        _config(engine={"kind": "dev", "model": "/nonexistent/model"}),
        [VALID_ROW],
        "engine.model: '/nonexistent/model' is neither a tiny model (tiny, tiny-deepseek-v3",
    ),
    (
        "unknown-role",
        _config(),
        [{"messages": [{"role": "hacker", "content": "hi"}]}],
        "line 1: messages[0].role: Input should be 'system', 'developer', 'user', 'assistant' or 'tool'",
    ),
    (
        "files-escape",
        _config(),
        [VALID_ROW, {"prompt": "p", "files": {"../../etc/cron.d/x": "boom"}}],
        "line 2: files: path '../../etc/cron.d/x' escapes the sandbox workspace",
    ),
    (
        "tests-absolute",
        _config(),
        [{"prompt": "p", "tests": {"/etc/passwd": "x"}}],
        "line 1: tests: path '/etc/passwd' is outside the sandbox workspace",
    ),
    ("nul-in-prompt", _config(), [{"prompt": "a\x00b"}], "line 1: prompt: contains a NUL character"),
    (
        "nul-in-metadata",
        _config(),
        [{"prompt": "p", "metadata": {"notes": ["ok", "x\x00"]}}],
        "line 1: metadata.notes[1]: contains a NUL character",
    ),
    (
        "lone-surrogate",
        _config(),
        '{"prompt": "p \\ud800"}\n',
        "line 1: prompt: contains invalid UTF-8 (a lone surrogate)",
    ),
    ("not-json", _config(), "{prompt: p}\n", "line 1: not valid JSON"),
    ("unknown-row-field", _config(), [{"prompt": "p", "lable": "x"}], "line 1: lable: Extra inputs"),
    ("empty-dataset", _config(), "", "has no tasks"),
    ("no-dataset-file", _config(dataset={"path": "missing.jsonl"}), [VALID_ROW], "does not exist"),
    (
        "secret-in-sandbox-env",
        _config(sandbox={"env": {"GH": "ghp_" + "a" * 36}}),
        [VALID_ROW],
        "sandbox.env.GH: the value looks like a secret",
    ),
    (
        "secret-in-agent-env",
        _config(agent={"kind": "command", "command": ["true"], "env": {"K": "sk-" + "b" * 30}}),
        [VALID_ROW],
        "agent.env.K: the value looks like a secret",
    ),
    (
        "undeclared-secret-variable",
        _config(secrets={"sandbox": ["DRESSAGE_TEST_NO_SUCH_VARIABLE"]}),
        [VALID_ROW],
        "secrets.sandbox: DRESSAGE_TEST_NO_SUCH_VARIABLE is not set in the worker's environment",
    ),
    ("unknown-agent-kind", _config(agent={"kind": "gpt-agent"}), [VALID_ROW], "agent: unknown kind"),
    ("bad-concurrency", _config(worker={"concurrency": 0}), [VALID_ROW], "worker.concurrency"),
    ("run-name-nul", _config(run="a\x00b"), [VALID_ROW], "run: run name must be"),
]


def _one_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), stderr
    return lines[0]


@pytest.mark.parametrize(
    ("config", "rows", "message"),
    [pytest.param(c, r, m, id=i) for i, c, r, m in ROLLOUT_CASES],
)
def test_broken_rollout_inputs_fail_in_one_line_and_create_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: dict[str, Any], rows: Any, message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DRESSAGE_HOME", str(tmp_path / "home"))
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    text = rows if isinstance(rows, str) else "".join(json.dumps(r) + "\n" for r in rows)
    (tmp_path / "tasks.jsonl").write_text(text, encoding="utf-8", errors="surrogatepass")
    db = tmp_path / "log.db"
    result = CliRunner().invoke(
        app, ["rollout", "--no-progress", "--config", "run.yaml", "--database-url", f"sqlite:///{db}"]
    )
    assert result.exit_code == EXIT_ERROR, result.output + result.stderr
    assert message in _one_error_line(result.stderr)
    assert not db.exists() and not (tmp_path / "home").exists()


def _with_run(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    store = EventStore.open(settings=Settings(database_url=url, home=tmp_path / "home"))
    store.runs.create("r", {})
    store.close()
    return url


TRAIN_CASES: list[tuple[str, list[str], str, Callable[[Path], None]]] = [
    ("negative-lr", ["--lr", "-5"], "--lr must be a positive number, got -5.0", lambda p: None),
    ("nan-lr", ["--lr", "nan"], "--lr must be a positive number", lambda p: None),
    (
        "out-is-a-file",
        ["--out", "afile"],
        "--out afile is an existing file",
        lambda p: (p / "afile").write_text("keep me"),
    ),
    ("zero-batch", ["--global-batch-size", "0"], "--global-batch-size must be >= 1", lambda p: None),
    ("unknown-run", ["--from-run", "nope"], "no run named 'nope'", lambda p: None),
    ("unknown-backend", ["--backend", "jax"], "unknown backend 'jax'", lambda p: None),
]


@pytest.mark.parametrize(
    ("args", "message", "prepare"), [pytest.param(a, m, f, id=i) for i, a, m, f in TRAIN_CASES]
)
def test_broken_train_options_fail_in_one_line_and_leave_no_output(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    message: str,
    prepare: Callable[[Path], None],
) -> None:
    monkeypatch.chdir(tmp_path)
    url = _with_run(tmp_path)
    prepare(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    cmd = ["train", "--from-run", "r", "--backend", "torch", "--out", "new-out", "--database-url", url]
    result = CliRunner().invoke(app, [*cmd, *args])
    assert result.exit_code == EXIT_ERROR, result.output + result.stderr
    assert message in _one_error_line(result.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no empty output directory left
    if (tmp_path / "afile").exists():
        assert (tmp_path / "afile").read_text() == "keep me"


def test_the_error_handler_prints_every_line_of_a_message() -> None:
    import typer

    from dressage.commandline import EXIT_MISMATCH, handle_errors
    from dressage.errors import ConfigError, ReplayDriftError

    demo = typer.Typer()

    @demo.command()
    @handle_errors
    def fail(drift: bool = False) -> None:
        if drift:
            raise ReplayDriftError("step 2: batch hash differs")
        raise ConfigError("first line names the field\nsecond line: the detail")

    result = CliRunner().invoke(demo, [])
    assert result.exit_code == EXIT_ERROR
    assert result.stderr.splitlines() == ["error: first line names the field", "  second line: the detail"]
    assert CliRunner().invoke(demo, ["--drift"]).exit_code == EXIT_MISMATCH


def test_a_loop_with_a_broken_dataset_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DRESSAGE_HOME", str(tmp_path / "home"))
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(_config(train={}, loop={"iterations": 1})))
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"prompt": "p", "files": {"/abs": "x"}}) + "\n")
    db = tmp_path / "log.db"
    result = CliRunner().invoke(
        app, ["loop", "--no-progress", "--config", "run.yaml", "--database-url", f"sqlite:///{db}"]
    )
    assert result.exit_code == EXIT_ERROR, result.output + result.stderr
    assert "line 1: files: path '/abs' is outside the sandbox workspace" in _one_error_line(result.stderr)
    assert not db.exists() and not (tmp_path / "home").exists()


def test_replay_prints_the_consumer_name_as_written(tmp_path: Path) -> None:
    """rich used to turn ``train:loop:`` into an emoji (``train➿``)."""
    from dressage.training.consumer import Trainer
    from dressage.training.steps import StepOptions
    from tests.training.builders import build_run, simple

    url = f"sqlite:///{tmp_path / 'log.db'}"
    store = EventStore.open(settings=Settings(database_url=url, home=tmp_path / "home"))
    build_run(store, "r", [[simple(1.0, n_turns=1), simple(0.0, n_turns=1)]])
    Trainer(store, "r", StepOptions(2, 2), consumer="loop").run_steps()
    store.close()
    result = CliRunner().invoke(
        app, ["train", "--from-run", "r", "--consumer", "loop", "--replay", "--database-url", url]
    )
    assert result.exit_code == 0, result.output + result.stderr
    assert "replayed 1 steps of train:loop: every batch hash matches" in result.stderr
    assert "\u27bf" not in result.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["no-such-session", "--at-turn", "1"], "SESSION: no session 'no-such-session'"),
        (["{root}", "--at-turn", "5"], "--at-turn 5 is past session {root}'s 4 recorded turns"),
        (
            ["{root}", "--at-turn", "4"],
            "replay them all and generate no new token; fork at a turn below 4 (0..3)",
        ),
        (["{root}", "--at-turn", "1", "--branches", "0"], "--branches must be >= 1, got 0"),
        (["{root}", "--at-turn", "-1"], "--at-turn must be >= 0, got -1"),
        (["{root}", "--at-turn", "2"], "has no rollout config to fork with"),
    ],
)
def test_broken_fork_inputs_fail_in_one_line(tmp_path: Path, args: list[str], expected: str) -> None:
    from tests.view.builders import build_fork_tree

    url = f"sqlite:///{tmp_path / 'log.db'}"
    store = EventStore.open(settings=Settings(database_url=url, home=tmp_path / "home"))
    try:
        tree = build_fork_tree(store, "forks")
    finally:
        store.close()
    args = [a.format(root=tree.root) for a in args]
    result = CliRunner().invoke(app, ["fork", *args, "--database-url", url])
    assert result.exit_code == EXIT_ERROR, result.output
    lines = [x for x in result.output.splitlines() if x.strip()]
    assert (
        len(lines) == 1 and lines[0].startswith("error: ") and expected.format(root=tree.root) in lines[0]
    ), lines
