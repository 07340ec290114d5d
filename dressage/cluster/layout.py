"""Which actors go on which Ray node: a pure function of the cluster's nodes and the ``ray:`` section.

Kept apart from the Ray calls (:mod:`dressage.cluster.ray_rollout`) so the rules are plain to read:

* **workers**: every alive node that has ``workers_per_node`` x the worker's resources (CPUs,
  memory, custom resources such as ``sandbox_host``) gets ``workers_per_node`` worker actors, at
  most ``max_nodes`` nodes; a cluster where no node qualifies is an error naming what is missing.
* **proxies**: one per engine URL, on the node whose address is the URL's host (an engine that is
  a Ray actor, as slime's SGLang engines are, registers under its node's IP); an engine on no node
  of the cluster gets its proxy wherever Ray finds room.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from dressage.errors import ConfigError
from dressage.rollout.ray_config import RayConfig


@dataclass(frozen=True)
class NodeInfo:
    """One alive Ray node: its id, address and total resources (``ray.nodes()`` fields)."""

    node_id: str
    ip: str
    resources: dict[str, float]

    @classmethod
    def from_ray(cls, node: dict[str, Any]) -> NodeInfo:
        """From one entry of ``ray.nodes()``."""
        return cls(str(node["NodeID"]), str(node["NodeManagerAddress"]), dict(node.get("Resources") or {}))

    def fits(self, demand: dict[str, float]) -> bool:
        """True when the node's totals cover ``demand``."""
        return all(self.resources.get(k, 0.0) >= v for k, v in demand.items())


@dataclass(frozen=True)
class WorkerSlot:
    """One rollout worker actor: its node and its index on that node."""

    node: NodeInfo
    index: int


@dataclass(frozen=True)
class ProxySlot:
    """One proxy actor: the engine URL it fronts and the node it must run on (None: anywhere)."""

    engine_url: str
    node: NodeInfo | None


def worker_slots(nodes: list[NodeInfo], cfg: RayConfig) -> list[WorkerSlot]:
    """The worker actors of the run, spread node by node (see the module docstring)."""
    demand = cfg.worker.demand(cfg.workers_per_node)
    eligible = [n for n in nodes if n.fits(demand)]
    if cfg.max_nodes is not None:
        eligible = eligible[: cfg.max_nodes]
    if not eligible:
        have = "; ".join(f"{n.ip} ({n.node_id[:8]}): {_fmt(n.resources)}" for n in nodes) or "no alive node"
        raise ConfigError(
            f"ray: no node has what {cfg.workers_per_node} worker(s) need ({_fmt(demand)}); nodes: {have}. "
            "Lower ray.worker / ray.workers_per_node or start nodes with those resources "
            "(ray start --num-cpus N --resources '{\"sandbox_host\": 1}')"
        )
    return [WorkerSlot(n, k) for n in eligible for k in range(cfg.workers_per_node)]


def proxy_slots(engine_urls: list[str], nodes: list[NodeInfo]) -> list[ProxySlot]:
    """One proxy per engine, on the engine's node when its host is a node's address."""
    by_ip: dict[str, NodeInfo] = {}
    for n in nodes:
        by_ip.setdefault(n.ip, n)
    return [ProxySlot(url, by_ip.get(urlsplit(url).hostname or "")) for url in engine_urls]


def _fmt(resources: dict[str, float]) -> str:
    shown = {k: v for k, v in resources.items() if not k.startswith("node:") and k != "object_store_memory"}
    return ", ".join(
        f"{k}={v / 2**20:.0f}MiB" if k == "memory" else f"{k}={v:g}" for k, v in sorted(shown.items())
    )
