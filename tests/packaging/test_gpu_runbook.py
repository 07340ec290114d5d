"""docs/gpu.md's examples are things Dressage accepts: its run config parses, its commands parse."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from dressage.rollout.config import parse_config
from tests.packaging.test_docker import _parse_with_the_cli

REPO = Path(__file__).resolve().parents[2]
RUNBOOK = (REPO / "docs" / "gpu.md").read_text()


def test_the_runbook_run_config_is_a_valid_run_config() -> None:
    (block,) = re.findall(r"```yaml\n(.*?)```", RUNBOOK, flags=re.S)
    config = parse_config(yaml.safe_load(block), source="docs/gpu.md", base_dir=REPO / "examples")
    assert config.engine.kind == "sglang" and config.proxy.record_experts
    assert Path(config.dataset.path).is_file()


def test_the_runbook_dressage_worker_commands_parse() -> None:
    """Every ``dressage-worker ...`` line of the runbook's shell blocks (continuations joined)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", RUNBOOK, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            if line.startswith("dressage-worker "):
                commands.append(shlex.split(line)[1:])
    assert any(c[:1] == ["train"] for c in commands)
    for args in commands:
        _parse_with_the_cli([a.replace("postgresql://...", "postgresql://db/dressage") for a in args])
