"""Config, dataset and reward validation: every mistake gives one clear message."""

from __future__ import annotations

from pathlib import Path

import pytest

from dressage.agents import AgentResult, Task
from dressage.errors import ConfigError, RewardError
from dressage.rollout.config import load_config, parse_config
from dressage.rollout.datasets import load_tasks
from dressage.rollout.rewards import (
    ContainsConfig,
    ExactMatchConfig,
    LengthConfig,
    NormalizedMatchConfig,
    PythonRewardConfig,
    RewardInput,
    build_scorer,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BASE = {"run": "r", "dataset": {"path": "t.jsonl"}}


@pytest.mark.parametrize("name", ["quickstart.yaml", "coding.yaml", "blackbox.yaml"])
def test_examples_load_with_their_datasets(name: str) -> None:
    cfg = load_config(EXAMPLES / name)
    assert Path(cfg.dataset.path).is_absolute()
    assert load_tasks(cfg.dataset.path, cfg.dataset.limit)


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"agent": {"kind": "claude_code", "max_turns": 0}}, "agent.max_turns: Input should be greater than"),
        ({"agent": {"kind": "codex", "model": "x"}}, "agent.model: unknown field"),
        ({"agent": {"kind": "gpt-agent"}}, "agent: unknown kind 'gpt-agent'; expected one of 'answer'"),
        ({"agent": {"kind": "coding", "max_turn": 3}}, "agent.max_turn: unknown field"),
        ({"agent": {"kind": "command"}}, "agent.command: Field required"),
        ({"agent": {"kind": "python", "path": "not a path"}}, "is not a dotted path"),
        ({"worker": {"concurrency": 0}}, "worker.concurrency: Input should be greater than or equal to 1"),
        (
            {"sandbox": {"provider": "podman"}},
            "sandbox.provider: Input should be 'bwrap', 'image', 'docker', 'local' or 'e2b'",
        ),
        ({"sandbox": {"provider": "docker"}}, "sandbox.image: provider docker needs the image"),
        ({"sandbox": {"image": "python:3.12"}}, "sandbox.image: applies to providers image and docker"),
        ({"sandbox": {"provider": "docker", "image": " "}}, "sandbox.image: provider docker needs the image"),
        ({"engine": {"kind": "sglang"}}, "engine: engine kind 'sglang' needs 'urls'"),
        ({"reward": {"kind": "tests", "timeout_s": -1}}, "reward.timeout_s: Input should be greater than 0"),
        ({"n_samples_per_prompt": "four"}, "n_samples_per_prompt: Input should be a valid integer"),
        ({"datset": {}}, "datset: unknown field"),
        ({"model_profile": "llama9"}, "model_profile: unknown model profile 'llama9'; known: deepseek-v3"),
        (
            {"model_profile": "mistral-nemo", "engine": {"model": "tiny-deepseek-v3"}},
            "is a tiny deepseek-v3 model; model_profile is 'mistral-nemo'",
        ),
        ({"proxy": {"profile": "qwen3.5"}}, "proxy.profile: unknown field"),
        (
            {"proxy": {"urls": ["proxy1:8000"]}},
            "proxy.urls: proxy URL 'proxy1:8000' is not an http(s)://host:port",
        ),
        ({"proxy": {"urls": ["http://a:1", "http://a:1/"]}}, "proxy.urls: proxy.urls lists a proxy twice"),
        ({"sandbox": {"limits": []}}, "sandbox.limits: accept at least one mechanism: cgroup, rlimit"),
        ({"sandbox": {"limits": ["cgroups"]}}, "sandbox.limits[0]: Input should be 'cgroup' or 'rlimit'"),
        ({"sandbox": {"limits": ["rlimit", "rlimit"]}}, "sandbox.limits: each mechanism once"),
        ({"sandbox": {"limits": "rlimit"}}, "sandbox.limits: Input should be a valid list"),
        (
            {"sandbox": {"provider": "e2b", "limits": ["cgroup", "rlimit"]}},
            "sandbox.limits: applies to provider bwrap; e2b enforces its own",
        ),
        (
            {"checkpoints": {"keep": "last:0"}},
            "checkpoints.keep: checkpoints.keep must be all, forks or last:N",
        ),
        (
            {"checkpoints": {"keep": "some"}},
            "checkpoints.keep: checkpoints.keep must be all, forks or last:N",
        ),
        ({"checkpoints": {"keep": "forks"}}, "checkpoints.keep: forks keeps the turns a tree forks at"),
        (
            {"checkpoints": {}, "sandbox": {"provider": "docker", "image": "python:3.12-slim"}},
            "checkpoints are not built for sandbox provider 'docker' (only bwrap, local, image, e2b)",
        ),
    ],
)
def test_bad_configs_name_the_field(patch: dict, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config({**BASE, **patch}, source="run.yaml")
    first_line = str(e.value).splitlines()[0]
    assert first_line.startswith("run.yaml: ") and message in first_line


def test_all_mistakes_reported_at_once() -> None:
    with pytest.raises(ConfigError, match=r"run.yaml: 3 mistakes: dataset: Field required; .*; worker.bogus"):
        parse_config({"run": "r", "sampling": {"top_p": 2}, "worker": {"bogus": 1}}, source="run.yaml")


def test_yaml_and_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: x\ndataset: [unclosed\n")
    with pytest.raises(ConfigError, match=r"invalid YAML at line \d+"):
        load_config(bad)
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(bad)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            '{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}',
            "exactly one of 'prompt' or 'messages'",
        ),
        ('{"label": 1}', "exactly one of 'prompt' or 'messages'"),
        ('{"prompt": "a", "lable": 1}', "lable: Extra inputs are not permitted"),
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
    ],
)
def test_dataset_errors_name_the_line(tmp_path: Path, line: str, message: str) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text('{"prompt": "ok"}\n\n' + line + "\n")
    with pytest.raises(ConfigError, match=r"t.jsonl line 3: ") as e:
        load_tasks(p)
    assert message in str(e.value)


def test_dataset_rows_roundtrip_through_the_queue_payload(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text(
        '{"prompt": "p", "label": ["a", "b"], "metadata": {"k": 1}, "files": {"a.py": "x"}}\n'
        '// a comment\n{"messages": [{"role": "user", "content": "hi"}], "id": "m1"}\n'
    )
    tasks = load_tasks(p)
    assert [t.index for t in tasks] == [0, 1] and tasks[1].prompt_text() == "hi"
    assert all(Task.from_payload(t.to_payload()) == t for t in tasks)
    assert len(load_tasks(p, limit=1)) == 1


def _score(cfg, answer: str, label) -> tuple[float, dict]:
    import asyncio

    inp = RewardInput(
        Task(index=0, prompt="p", label=label), answer, AgentResult(answer=answer), sandbox=None
    )  # type: ignore[arg-type]
    out = asyncio.run(build_scorer(cfg).score(inp))
    return out.reward, out.details


def test_builtin_rewards() -> None:
    assert _score(ExactMatchConfig(), " 42 ", "42")[0] == 1.0
    assert _score(ExactMatchConfig(), "42.", "42")[0] == 0.0
    assert _score(NormalizedMatchConfig(), "Work...\nThe Answer: 1,000!", "the answer: 1000")[0] == 1.0
    assert _score(ContainsConfig(), "hEllo", "e")[0] == 1.0
    assert _score(ContainsConfig(case_sensitive=True), "hEllo", "E")[0] == 1.0
    assert _score(ContainsConfig(), "ab", ["a", "z"]) == (
        0.5,
        {"kind": "contains", "found": ["a"], "answer_chars": 2},
    )
    assert _score(LengthConfig(max_chars=5), "abcdefghij", None)[0] == 0.5
    assert _score(LengthConfig(max_chars=5), "", None)[0] == 0.0
    with pytest.raises(RewardError, match="has no label"):
        _score(ContainsConfig(), "x", None)


def test_python_reward(tmp_path: Path) -> None:
    cfg = PythonRewardConfig(path="tests.rollout.rewards_for_tests:char_count", options={"char": "a"})
    assert _score(cfg, "banana", None) == (3.0, {"kind": "python", "count": 3})
    with pytest.raises(RewardError, match="raised ZeroDivisionError"):
        _score(PythonRewardConfig(path="tests.rollout.rewards_for_tests:broken"), "x", None)
    with pytest.raises(RewardError, match="non-finite"):
        _score(PythonRewardConfig(path="tests.rollout.rewards_for_tests:nan"), "x", None)
    with pytest.raises(ConfigError, match="cannot import module"):
        build_scorer(PythonRewardConfig(path="nowhere.mod:f"))


def test_sampling_seed_is_distinct_per_sample_and_stable() -> None:
    from dressage.rollout.config import SamplingConfig

    cfg = SamplingConfig(seed=7, max_tokens=4)
    seeds = {
        cfg.request_kwargs(task_index=t, sample_index=k, attempt=a)["seed"]
        for t in range(20)
        for k in range(8)
        for a in (1, 2)
    }
    assert len(seeds) == 20 * 8 * 2, "every (task, sample, attempt) gets its own seed"
    assert (
        cfg.request_kwargs(task_index=3, sample_index=1)["seed"]
        == cfg.request_kwargs(task_index=3, sample_index=1)["seed"]
    )
    assert "seed" not in SamplingConfig(max_tokens=4).request_kwargs(task_index=3)
    assert "sampling_seed" not in cfg.engine_defaults(), (
        "a fixed engine default would make every sample alike"
    )


def test_sandbox_limits_reach_the_spec_and_the_snapshot_only_when_not_the_default() -> None:
    strict = parse_config(BASE)
    assert strict.sandbox.spec({}, None).limits == ("cgroup",)
    assert "limits" not in strict.snapshot()["sandbox"]  # snapshots from before the field compare equal
    weaker = parse_config({**BASE, "sandbox": {"limits": ["cgroup", "rlimit"]}})
    assert weaker.sandbox.spec({}, None).limits == ("cgroup", "rlimit")
    assert weaker.snapshot()["sandbox"]["limits"] == ["cgroup", "rlimit"]
    assert parse_config(weaker.snapshot()) == weaker  # a resumed run reads it back


def test_checkpoints_section_retention_and_snapshot() -> None:
    off = parse_config(BASE)
    assert off.checkpoints is None and "checkpoints" not in off.snapshot()  # runs from before compare equal
    on = parse_config({**BASE, "checkpoints": {"keep": "last:2"}})
    assert on.checkpoints is not None
    assert on.checkpoints.to_prune([0, 1, 2, 3], []) == [0, 1]
    assert on.checkpoints.to_prune([3], []) == []
    assert on.snapshot()["checkpoints"]["keep"] == "last:2"
    assert parse_config(on.snapshot()) == on
    forks = parse_config(
        {**BASE, "checkpoints": {"keep": "forks"}, "branching": {"at": "turns", "turns": [2, 4]}}
    ).checkpoints
    assert forks is not None and forks.to_prune([0, 1, 2, 3, 4], [2, 4]) == [0, 1, 3]
    every = parse_config({**BASE, "checkpoints": {}}).checkpoints
    assert every is not None and every.to_prune([0, 1, 2], []) == []
