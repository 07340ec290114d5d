"""The ``ray:`` section of ``run.yaml``: how ``--ray`` places a run's actors on a Ray cluster.

Typed and strict like every other section (an unknown or malformed field is one clear mistake
naming ``ray.<field>``). It is a per-deployment choice, like ``worker.concurrency``: not part of
the run's frozen config, so the same run can be resumed on another cluster layout. Nothing here
imports Ray.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ActorResources(_Strict):
    """What one actor asks Ray for: CPUs, memory and custom resources (e.g. ``sandbox_host: 1``).

    A node gets an actor only if it has all of them; a custom resource that only sandbox hosts
    declare (``ray start --resources '{"sandbox_host": 8}'``) keeps workers on those hosts.
    """

    num_cpus: float = Field(default=1.0, ge=0, description="CPUs reserved per actor (fractions allowed).")
    memory_mb: int | None = Field(default=None, ge=1, description="Memory reserved per actor (MiB).")
    resources: dict[str, float] = Field(
        default_factory=dict, description="Custom resources per actor, e.g. {sandbox_host: 1}."
    )

    @field_validator("resources")
    @classmethod
    def _custom_resources(cls, v: dict[str, float]) -> dict[str, float]:
        for name, amount in v.items():
            if not name.strip() or name in ("CPU", "GPU", "memory", "object_store_memory"):
                raise ValueError(
                    f"custom resource name {name!r}: give a name of your own (CPUs and memory have "
                    "num_cpus and memory_mb)"
                )
            if not amount > 0:
                raise ValueError(f"custom resource {name!r} must be > 0, got {amount}")
        return v

    def ray_options(self) -> dict[str, object]:
        """These resources as keyword arguments of ``ActorClass.options``."""
        out: dict[str, object] = {"num_cpus": self.num_cpus}
        if self.memory_mb is not None:
            out["memory"] = self.memory_mb * 1024 * 1024
        if self.resources:
            out["resources"] = dict(self.resources)
        return out

    def demand(self, times: int = 1) -> dict[str, float]:
        """What ``times`` such actors need of a node, in the names of ``ray.nodes()[i]["Resources"]``."""
        out = {"CPU": self.num_cpus * times, **{k: v * times for k, v in self.resources.items()}}
        if self.memory_mb is not None:
            out["memory"] = float(self.memory_mb * 1024 * 1024 * times)
        return out


class ServiceResources(ActorResources):
    """What the proxy or the dev engine actor asks Ray for: half a CPU by default, so the engine,
    its proxy and one rollout worker (1 CPU) fit a 2-CPU machine (``--ray local`` on a laptop)."""

    num_cpus: float = Field(default=0.5, ge=0, description="CPUs reserved per actor (fractions allowed).")


class RayConfig(_Strict):
    """``ray:``: rollout workers, proxies and the dev engine as Ray actors (``--ray``; docs/scale.md).

    Every alive node that has ``workers_per_node`` times ``worker``'s resources free (after the
    engine and proxy actors, :mod:`dressage.cluster.layout`) gets
    ``workers_per_node`` rollout worker actors (at most ``max_nodes`` nodes, in the order Ray lists
    them); each runs the same lease loop as ``dressage-worker rollout`` with ``worker.concurrency``
    episodes at once. One proxy actor per engine runs on the engine's node. Ray restarts an actor
    that dies up to ``max_restarts`` times (-1: always); the log's leases keep every (task, sample)
    exactly once whatever Ray does.
    """

    workers_per_node: int = Field(default=1, ge=1, le=1024, description="Rollout worker actors per node.")
    max_nodes: int | None = Field(default=None, ge=1, description="Use at most this many nodes for workers.")
    worker: ActorResources = Field(default_factory=ActorResources, description="Per rollout worker actor.")
    proxy: ServiceResources = Field(default_factory=ServiceResources, description="Per proxy actor.")
    engine: ServiceResources = Field(
        default_factory=ServiceResources, description="The dev engine's actor (engine.kind: dev)."
    )
    max_restarts: int = Field(default=3, ge=-1, description="Restarts of a dead actor; -1: unlimited.")
