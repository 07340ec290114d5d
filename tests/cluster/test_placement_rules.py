"""Ray stays optional, and the ``ray:`` section and the placement rules (no Ray cluster needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dressage.cluster.layout import NodeInfo, proxy_slots, service_slots, worker_slots
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
    with pytest.raises(
        ConfigError, match=r"sandbox_host=1.*nodes \(free of total\): 10\.0\.0\.1 \(n1-id\): CPU=8 of 8"
    ):
        worker_slots([node("n1", 8)], cfg)


def test_a_proxy_goes_to_its_engine_s_node() -> None:
    nodes = [node("n1", 8), node("n2", 8)]
    slots = proxy_slots(["http://10.0.0.2:30000", "http://gpu-elsewhere:30000"], nodes)
    assert [(s.engine_url, s.node.node_id if s.node else None) for s in slots] == [
        ("http://10.0.0.2:30000", "n2-id"),
        ("http://gpu-elsewhere:30000", None),
    ]


def test_the_defaults_fit_a_two_cpu_machine() -> None:
    """The quickstart's case: the dev engine, its proxy and one worker on one 2-CPU node."""
    cfg = RayConfig()
    two = node("n1", 2)
    services = service_slots([two], cfg, None)
    assert services.engine_node is not None and services.engine_node.node_id == "n1-id"
    assert services.nodes[0].available["CPU"] == pytest.approx(1.0)
    assert [s.node.node_id for s in worker_slots(services.nodes, cfg, services.taken)] == ["n1-id"]


def test_a_worker_is_checked_against_what_the_engine_and_proxy_leave() -> None:
    """1.5 CPUs fit the node's 2, not the 1 the engine and proxy leave: refused in one line."""
    cfg = RayConfig.model_validate({"worker": {"num_cpus": 1.5}})
    services = service_slots([node("n1", 2)], cfg, None)
    with pytest.raises(ConfigError) as e:
        worker_slots(services.nodes, cfg, services.taken)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(
        "ray: no node has what 1 worker(s) need (CPU=1.5) free after this run's dev engine (CPU=0.5) and "
        "proxy (CPU=0.5) actors on 10.0.0.1; nodes (free of total): 10.0.0.1 (n1-id): CPU=1 of 2, "
        "memory=16384 of 16384MiB."
    )


def test_what_other_actors_hold_is_not_free() -> None:
    busy = NodeInfo("n1-id", "10.0.0.1", {"CPU": 8.0}, free={"CPU": 0.75})
    with pytest.raises(
        ConfigError, match=r"dev engine and its proxy \(CPU=0.5 \+ CPU=0.5\) free; .*CPU=0.75 of 8"
    ):
        service_slots([busy], RayConfig(), None)


def test_the_engine_goes_where_it_leaves_room_for_the_most_workers() -> None:
    cfg = RayConfig.model_validate({"worker": {"num_cpus": 2}})
    nodes = [node("n1", 2), node("n2", 3), node("n3", 2)]
    services = service_slots(nodes, cfg, None)
    assert services.engine_node is not None and services.engine_node.node_id == "n2-id"
    assert [s.node.node_id for s in worker_slots(services.nodes, cfg)] == ["n1-id", "n2-id", "n3-id"]


def test_proxies_go_to_their_engine_s_node_while_it_has_room() -> None:
    cfg = RayConfig.model_validate({"proxy": {"num_cpus": 1}})
    nodes = [node("n1", 8), node("n2", 1)]
    urls = ["http://10.0.0.2:30000", "http://10.0.0.2:30001", "http://gpu-elsewhere:30000"]
    services = service_slots(nodes, cfg, urls)
    assert [s.node.node_id if s.node else None for s in services.proxies] == ["n2-id", "n1-id", "n1-id"]
    assert [n.available["CPU"] for n in services.nodes] == [6.0, 0.0]
