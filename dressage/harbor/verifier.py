"""The ``harbor`` reward: run the task's own ``tests/test.sh`` and read its reward file as Harbor does.

After the agent ends: ``/tests`` and ``/logs/verifier`` are emptied (nothing the agent put there
counts), the agent's final answer is written to ``/logs/agent/answer.txt`` (so tasks can score
agents that only answer, e.g. the ``answer`` kind), the task's tests are written to ``/tests``, and ``/tests/test.sh`` runs from the task's
working directory with ``[verifier] env`` and ``timeout_sec``, its output going to
``/logs/verifier/test-stdout.txt`` (Harbor's command). Then ``reward.json`` is read if present, else
``reward.txt``, with Harbor's rules: an empty file, text that is not a number, a non-numeric or
non-finite value, or no file at all is a :class:`~dressage.errors.RewardError` (the session fails
with that message; it is never a silent 0). A ``reward.json`` with several keys is kept whole in
the ``reward`` event's details; per task, :func:`choose_reward` picks what trains (``reward.key``
where the task wrote it, else the ``reward.weights`` sum, else the only value, else ``reward``) and
the details say which rule did (``chosen_by``). When no rule applies the session still finishes,
its rewards whole, with a NULL scalar reward and the reason in ``details["no_scalar_reward"]``.

``[verifier] environment_mode = "separate"``: the tests run in a fresh sandbox of the same task,
seeded with the agent's final workspace (its ``.harbor/`` left out), so processes or mounts of the
agent's sandbox cannot touch the verification.
"""

from __future__ import annotations

import json
import math
import shlex

from dressage.errors import NoScalarRewardError, RewardError, SandboxError
from dressage.harbor.sandbox import TESTS_DIR, VERIFIER_LOGS, internet_note
from dressage.harbor.tasks import harbor_info
from dressage.paddock import Sandbox
from dressage.redact import redacted_tail
from dressage.rollout.rewards import HarborRewardConfig, RewardInput, RewardOutput

TAIL_CHARS = 2000
ANSWER_FILE = ".harbor/logs/agent/answer.txt"
"""Where the agent's final answer is for the tests (``/logs/agent/answer.txt``): answer-only agents are scored too."""
CLEAR = "find -H /tests /logs -mindepth 1 -delete 2>/dev/null; mkdir -p /logs/verifier /logs/agent"


def parse_reward_text(text: str) -> dict[str, float]:
    """``reward.txt``: one finite number (Harbor's ``{"reward": value}``)."""
    if not text.strip():
        raise RewardError("reward.txt is empty")
    try:
        value = float(text)
    except ValueError:
        raise RewardError(f"reward.txt is not a number: {text.strip()[:80]!r}") from None
    if not math.isfinite(value):
        raise RewardError(f"reward.txt holds a non-finite reward {value!r}")
    return {"reward": value}


def parse_reward_json(text: str) -> dict[str, float]:
    """``reward.json``: an object of finite numbers (a bare number reads as ``{"reward": n}``)."""
    if not text.strip():
        raise RewardError("reward.json is empty")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise RewardError(f"reward.json is not valid JSON: {e.msg}") from None
    if isinstance(data, int | float) and not isinstance(data, bool):
        data = {"reward": data}
    if not isinstance(data, dict) or not data:
        raise RewardError("reward.json must be an object of named numbers")
    for key, value in data.items():
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise RewardError(f"reward.json: non-numeric reward {key}={value!r}")
        if not math.isfinite(value):
            raise RewardError(f"reward.json: non-finite reward {key}={value!r}")
    return {str(k): float(v) for k, v in data.items()}


def choose_reward(
    rewards: dict[str, float], key: str | None, weights: dict[str, float] | None
) -> tuple[float, str]:
    """The trained number of one task and how it was chosen, by the first rule that applies to it:

    1. ``reward.key`` when the task wrote that key;
    2. the ``reward.weights`` sum when the task wrote every weighted key;
    3. the task's only value (a ``reward.txt`` is ``{"reward": value}``);
    4. its ``reward`` key among several.

    So one config serves a dataset whose tasks write different files. When no rule applies,
    :class:`~dressage.errors.NoScalarRewardError` says so with every value the task wrote: the
    session still finishes, its rewards whole in the ``reward`` event and its scalar reward NULL.
    """
    if key is not None and key in rewards:
        return rewards[key], f"key {key!r}"
    if weights and set(weights) <= set(rewards):
        return sum(w * rewards[k] for k, w in weights.items()), "weights"
    if len(rewards) == 1:
        return next(iter(rewards.values())), "the only value"
    if "reward" in rewards:
        return rewards["reward"], "key 'reward'"
    wrote = json.dumps(rewards, sort_keys=True)
    if key is not None:
        raise NoScalarRewardError(
            f"reward key {key!r} is not among the task's rewards {wrote}, and no other rule applies"
        )
    if weights:
        missing = sorted(set(weights) - set(rewards))
        raise NoScalarRewardError(f"reward.weights name {missing} that the task's rewards {wrote} lack")
    raise NoScalarRewardError(
        f"the task wrote several rewards {wrote}: set reward.key or reward.weights in the run config"
    )


def select_reward(rewards: dict[str, float], key: str | None, weights: dict[str, float] | None) -> float:
    """The trained number (see :func:`choose_reward`)."""
    return choose_reward(rewards, key, weights)[0]


def _chosen(
    rewards: dict[str, float], cfg: HarborRewardConfig
) -> tuple[float | None, str | None, str | None]:
    """(trained number, rule, None), or (None, None, why) when no rule picks one (rewards kept whole)."""
    try:
        value, chosen_by = choose_reward(rewards, cfg.key, dict(cfg.weights) if cfg.weights else None)
    except NoScalarRewardError as e:
        return None, None, str(e)
    return value, chosen_by, None


async def _file(sandbox: Sandbox, name: str) -> str | None:
    names = {f.name for f in await sandbox.list_files(VERIFIER_LOGS)}
    if name not in names:
        return None
    return (await sandbox.read_file(f"{VERIFIER_LOGS}/{name}")).decode("utf-8", "replace")


async def _seed_from(agent_sandbox: Sandbox, fresh: Sandbox) -> None:
    """Copy the agent's final workspace (without ``.harbor/``) into the verifier's fresh sandbox."""
    data = await agent_sandbox.archive()
    await fresh.write_file(".harbor/final.tar.gz", data)
    r = await fresh.exec(
        "tar -xzf .harbor/final.tar.gz --exclude=./.harbor && rm -f .harbor/final.tar.gz", timeout=120
    )
    if not r.ok:
        raise RewardError(f"copying the agent's files into the separate verifier failed: {r.stderr[-300:]}")


async def verify(cfg: HarborRewardConfig, inp: RewardInput) -> RewardOutput:
    """Run the task's tests and read its reward (see the module docstring)."""
    info = harbor_info(inp.task)
    if info is None:
        raise RewardError(f"task {inp.task.index} is not a Harbor task; reward 'harbor' needs one")
    separate = info["verifier_mode"] == "separate"
    sandbox = inp.sandbox
    if separate:
        if inp.fresh_sandbox is None:
            raise RewardError("this worker cannot start a separate verifier sandbox")
        sandbox = await inp.fresh_sandbox()
    try:
        if separate:
            await _seed_from(inp.sandbox, sandbox)
        await sandbox.exec(CLEAR, timeout=60)
        await sandbox.write_file(ANSWER_FILE, inp.answer)
        for rel, text in inp.task.tests.items():
            await sandbox.write_file(f"{TESTS_DIR}/{rel}", text)
        workdir = shlex.quote(str(info["workdir"]))
        command = f"cd {workdir} && chmod +x /tests/test.sh && (/tests/test.sh) > /logs/verifier/test-stdout.txt 2>&1"
        r = await sandbox.exec(
            command, env=dict(info.get("verifier_env") or {}), timeout=float(info["verifier_timeout_s"])
        )
        stdout = await _file(sandbox, "test-stdout.txt") or ""
        raw_json, raw_txt = await _file(sandbox, "reward.json"), await _file(sandbox, "reward.txt")
    except SandboxError as e:
        raise RewardError(f"the verifier of task {info['name']} could not run: {e}") from e
    finally:
        if separate:
            await sandbox.terminate()
    where = f"task {info['name']} (test.sh exit {r.exit_code}{', timed out' if r.timed_out else ''})"
    try:
        if raw_json is not None:
            rewards, source = parse_reward_json(raw_json), "reward.json"
        elif raw_txt is not None:
            rewards, source = parse_reward_text(raw_txt), "reward.txt"
        else:
            raise RewardError(
                "no reward file: test.sh wrote neither /logs/verifier/reward.txt nor reward.json"
            )
        value, chosen_by, unchosen = _chosen(rewards, cfg)
    except RewardError as e:
        tail = redacted_tail(stdout.strip(), 300)
        raise RewardError(f"{where}: {e}" + (f"; test output ends: {tail}" if tail else "")) from None
    details: dict[str, object] = {
        "task": info["name"],
        "checksum": info["checksum"],
        "rewards": rewards,
        "source": source,
        "key": cfg.key,
        "weights": dict(cfg.weights) if cfg.weights else None,
        "chosen_by": chosen_by,
        **({"no_scalar_reward": unchosen} if unchosen is not None else {}),
        "verifier_mode": "separate" if separate else "shared",
        "exit_code": r.exit_code,
        "timed_out": r.timed_out,
        "internet": internet_note(inp.sandbox.spec.network, info),
        "test_stdout_tail": redacted_tail(stdout, TAIL_CHARS),
    }
    return RewardOutput(value, details)
