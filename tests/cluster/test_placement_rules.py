"""Ray stays optional, and the ``ray:`` section and the placement rules (no Ray cluster needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dressage.cluster.layout import NodeInfo, proxy_slots, worker_slots
from dressage.errors import ConfigError
from dressage.rollout.config import parse_config
from dressage.rollout.ray_config import RayConfig

REPO = Path(__file__).resolve().parents[2]
GIB = 2.0**30


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=str(REPO), capture_output=True, text=True, timeout=300
    )


def test_importing_the_cli_and_the_rollout_does_not_import_ray() -> None:
    done = run_python(
        "import sys\n"
        "import dressage.cli, dressage.rollout.worker, dressage.loop.runner, dressage.cluster\n"
        "import dressage.cluster.layout, dressage.integrations.slime\n"
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("command", ["rollout", "loop"])
def test_without_ray_the_flag_says_how_to_install_it(command: str) -> None:
    done = run_python(
        "import sys\n"
        "sys.modules['ray'] = None  # as if Ray were not installed\n"
        "from dressage.cli import main\n"
        f"sys.argv = ['dressage-worker', '{command}', '--ray', 'local', '--config', 'examples/quickstart.yaml',"
        " '--database-url', 'sqlite:////nonexistent/dir/log.db']\n"
        "main()\n"
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "--ray needs Ray" in done.stderr and "pip install 'dressage[ray]'" in done.stderr


def base() -> dict[str, object]:
    return yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())


def test_a_malformed_ray_section_is_refused_naming_each_field() -> None:
    data = {
        **base(),
        "ray": {"workers_per_node": 0, "worker": {"resources": {"CPU": 1, "sandbox_host": -1}}, "nodes": 2},
    }
    with pytest.raises(ConfigError) as e:
        parse_config(data, source="run.yaml")
    msg = str(e.value)
    assert "ray.workers_per_node" in msg and "ray.worker.resources" in msg
    assert "ray.nodes: unknown field" in msg


def test_the_ray_section_is_not_frozen_with_the_run() -> None:
    plain = parse_config(base())
    placed = parse_config({**base(), "ray": {"workers_per_node": 4}})
    assert placed.ray == RayConfig(workers_per_node=4)
    assert placed.snapshot() == plain.snapshot()


def node(name: str, cpus: float, **custom: float) -> NodeInfo:
    return NodeInfo(f"{name}-id", f"10.0.0.{name[-1]}", {"CPU": cpus, "memory": 16 * GIB, **custom})


def test_workers_go_to_the_nodes_that_have_their_resources() -> None:
    nodes = [node("n1", 8, sandbox_host=4), node("n2", 2), node("n3", 8, sandbox_host=4)]
    cfg = RayConfig.model_validate(
        {
            "workers_per_node": 2,
            "worker": {"num_cpus": 2, "memory_mb": 1024, "resources": {"sandbox_host": 2}},
        }
    )
    slots = worker_slots(nodes, cfg)
    assert [(s.node.node_id, s.index) for s in slots] == [
        ("n1-id", 0),
        ("n1-id", 1),
        ("n3-id", 0),
        ("n3-id", 1),
    ]
    assert [s.node.node_id for s in worker_slots(nodes, cfg.model_copy(update={"max_nodes": 1}))] == [
        "n1-id"
    ] * 2


def test_no_node_with_the_resources_is_an_error_saying_what_is_missing() -> None:
    cfg = RayConfig.model_validate({"worker": {"resources": {"sandbox_host": 1}}})
    with pytest.raises(ConfigError, match=r"sandbox_host=1.*nodes: 10\.0\.0\.1 \(n1-id\): CPU=8"):
        worker_slots([node("n1", 8)], cfg)


def test_a_proxy_goes_to_its_engine_s_node() -> None:
    nodes = [node("n1", 8), node("n2", 8)]
    slots = proxy_slots(["http://10.0.0.2:30000", "http://gpu-elsewhere:30000"], nodes)
    assert [(s.engine_url, s.node.node_id if s.node else None) for s in slots] == [
        ("http://10.0.0.2:30000", "n2-id"),
        ("http://gpu-elsewhere:30000", None),
    ]
