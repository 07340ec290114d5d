"""Which actors go on which Ray node: a pure function of the cluster's nodes and the ``ray:`` section.

Kept apart from the Ray calls (:mod:`dressage.cluster.ray_rollout`) so the rules are plain to read.
Every rule counts what a node has **free** (its resources not held by other actors when the run is
placed, less what this run's engine and proxy actors take), never its totals, so a demand that
cannot be met is refused before any actor is created instead of waiting forever:

* **dev engine** (``engine.kind: dev``): on the node, of those with room for it and its proxy, that
  leaves room for the most workers (the first such in Ray's order);
* **proxies**: one per engine URL, on the node whose address is the URL's host (an engine that is
  a Ray actor, as slime's SGLang engines are, registers under its node's IP) when it has room,
  else on the first node with room; the dev engine's proxy on the engine's node;
* **workers**: every node that has ``workers_per_node`` x the worker's resources (CPUs, memory,
  custom resources such as ``sandbox_host``) left after those gets ``workers_per_node`` worker
  actors, at most ``max_nodes`` nodes.

A demand no node can meet is a :class:`ConfigError` of one line naming the demand and every
node's free and total resources.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from dressage.errors import ConfigError
from dressage.rollout.ray_config import RayConfig


@dataclass(frozen=True)
class NodeInfo:
    """One alive Ray node: its id, address, total resources (``ray.nodes()`` fields) and the part
    of them that is free (``free``; None: all of them)."""

    node_id: str
    ip: str
    resources: dict[str, float]
    free: dict[str, float] | None = field(default=None, compare=False)

    @classmethod
    def from_ray(cls, node: dict[str, Any], free: dict[str, float] | None = None) -> NodeInfo:
        """From one entry of ``ray.nodes()`` and what Ray reports free on it."""
        total = dict(node.get("Resources") or {})
        return cls(str(node["NodeID"]), str(node["NodeManagerAddress"]), total, free)

    @property
    def available(self) -> dict[str, float]:
        """What the node has free."""
        return self.resources if self.free is None else self.free

    def fits(self, demand: dict[str, float]) -> bool:
        """True when what the node has free covers ``demand``."""
        free = self.available
        return all(free.get(k, 0.0) >= v - 1e-9 for k, v in demand.items())

    def minus(self, demand: dict[str, float]) -> NodeInfo:
        """The node once ``demand`` is taken from what it has free."""
        free = dict(self.available)
        for k, v in demand.items():
            free[k] = free.get(k, 0.0) - v
        return replace(self, free=free)

    def describe(self) -> str:
        """``IP (id): CPU=1 of 2, ...``: free of total, per resource."""
        free = self.available
        shown = sorted(k for k in self.resources if not k.startswith("node:") and k != "object_store_memory")
        parts = [
            f"{k}={_amount(k, max(free.get(k, 0.0), 0.0))} of {_amount(k, self.resources[k])}"
            + ("MiB" if k == "memory" else "")
            for k in shown
        ]
        return f"{self.ip} ({self.node_id[:8]}): {', '.join(parts)}"


@dataclass(frozen=True)
class Services:
    """Where the dev engine and the proxies go, and what that leaves free on each node."""

    engine_node: NodeInfo | None
    proxies: list[ProxySlot]
    nodes: list[NodeInfo]
    """The nodes with what is left once the engine and proxies have their share."""
    taken: str
    """What they took, for messages (``dev engine CPU=0.5 + proxy CPU=0.5``; empty: nothing)."""


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


def worker_slots(nodes: list[NodeInfo], cfg: RayConfig, taken: str = "") -> list[WorkerSlot]:
    """The worker actors of the run, spread node by node (see the module docstring); ``taken``
    names what the run's engine and proxies already took from ``nodes`` (for the message)."""
    demand = cfg.worker.demand(cfg.workers_per_node)
    eligible = [n for n in nodes if n.fits(demand)]
    if cfg.max_nodes is not None:
        eligible = eligible[: cfg.max_nodes]
    if not eligible:
        after = f" after this run's {taken}" if taken else ""
        raise ConfigError(
            f"ray: no node has what {cfg.workers_per_node} worker(s) need ({_fmt(demand)}) free{after}; "
            f"nodes (free of total): {_nodes(nodes)}. Lower ray.worker / ray.workers_per_node "
            "(or ray.engine / ray.proxy) or start nodes with those resources "
            "(ray start --num-cpus N --resources '{\"sandbox_host\": 1}')"
        )
    return [WorkerSlot(n, k) for n in eligible for k in range(cfg.workers_per_node)]


def service_slots(nodes: list[NodeInfo], cfg: RayConfig, engine_urls: list[str] | None) -> Services:
    """The dev engine's node (``engine_urls`` None: the run's dev engine) and each proxy's, with
    what they leave free on every node (see the module docstring)."""
    if engine_urls is None:
        return _dev_engine_slots(nodes, cfg)
    demand = cfg.proxy.demand()
    left = list(nodes)
    slots: list[ProxySlot] = []
    for slot in proxy_slots(engine_urls, nodes):
        preferred = [
            i for i, n in enumerate(left) if slot.node is not None and n.node_id == slot.node.node_id
        ]
        room = [i for i in preferred if left[i].fits(demand)] or [
            i for i, n in enumerate(left) if n.fits(demand)
        ]
        if not room:
            raise ConfigError(
                f"ray: no node has room for the proxy of engine {slot.engine_url} ({_fmt(demand)}) free; "
                f"nodes (free of total): {_nodes(left)}. Lower ray.proxy or add a node"
            )
        left[room[0]] = left[room[0]].minus(demand)
        slots.append(ProxySlot(slot.engine_url, left[room[0]]))
    taken = f"{len(slots)} proxy actor(s) ({_fmt(demand)} each)" if slots else ""
    return Services(None, slots, left, taken)


def _dev_engine_slots(nodes: list[NodeInfo], cfg: RayConfig) -> Services:
    """The dev engine and its proxy on one node: the one with room for both that leaves room for
    the most workers."""
    engine, proxy = cfg.engine.demand(), cfg.proxy.demand()
    both = {k: engine.get(k, 0.0) + proxy.get(k, 0.0) for k in {*engine, *proxy}}
    candidates = [i for i, n in enumerate(nodes) if n.fits(both)]
    if not candidates:
        raise ConfigError(
            f"ray: no node has room for the dev engine and its proxy ({_fmt(engine)} + {_fmt(proxy)}) free; "
            f"nodes (free of total): {_nodes(nodes)}. Lower ray.engine / ray.proxy or add a node"
        )

    def workers_left(i: int) -> int:
        left = [n.minus(both) if j == i else n for j, n in enumerate(nodes)]
        return sum(1 for n in left if n.fits(cfg.worker.demand(cfg.workers_per_node)))

    best = max(candidates, key=lambda i: (workers_left(i), -i))
    left = [n.minus(both) if i == best else n for i, n in enumerate(nodes)]
    taken = f"dev engine ({_fmt(engine)}) and proxy ({_fmt(proxy)}) actors on {nodes[best].ip}"
    return Services(left[best], [], left, taken)


def proxy_slots(engine_urls: list[str], nodes: list[NodeInfo]) -> list[ProxySlot]:
    """One proxy per engine, on the engine's node when its host is a node's address."""
    by_ip: dict[str, NodeInfo] = {}
    for n in nodes:
        by_ip.setdefault(n.ip, n)
    return [ProxySlot(url, by_ip.get(urlsplit(url).hostname or "")) for url in engine_urls]


def _fmt(resources: dict[str, float]) -> str:
    shown = {k: v for k, v in resources.items() if not k.startswith("node:") and k != "object_store_memory"}
    return ", ".join(
        f"{k}={_amount(k, v)}" + ("MiB" if k == "memory" else "") for k, v in sorted(shown.items())
    )


def _amount(name: str, value: float) -> str:
    return f"{value / 2**20:.0f}" if name == "memory" else f"{round(value, 4):g}"


def _nodes(nodes: list[NodeInfo]) -> str:
    return "; ".join(n.describe() for n in nodes) or "no alive node"
