"""The rollout config (``run.yaml``): pydantic models, YAML loading, and one clear message per mistake.

Every section forbids unknown fields, so a misspelt option is an error rather than a silent default.
:func:`load_config` reports all mistakes at once on one line (``path: 2 mistakes: agent.kind: ...;
worker.concurrency: ...``), because the CLI prints the first line of an error. Relative paths
(``dataset.path``, ``eval.dataset.path``) are resolved against the config file's directory. The validated model, dumped
as JSON, is the run's frozen config snapshot.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from dressage.agents.config import AgentConfig, AnswerAgentConfig, dotted_path
from dressage.errors import ConfigError, SandboxError
from dressage.paddock import SandboxSpec
from dressage.paddock.limits import DEFAULT_LIMITS, LIMIT_MECHANISMS, LimitMechanism
from dressage.rollout.ray_config import RayConfig
from dressage.rollout.rewards import ContainsConfig, RewardConfig
from dressage.rollout.secrets import (
    SecretsConfig,
    check_config_has_no_secrets,
    check_no_cleartext_secrets,
    resolve_secrets,
)
from dressage.training.config import TrainConfig


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatasetConfig(_Strict):
    """JSONL tasks: one object per line with ``prompt`` or ``messages``, ``label``, ``metadata``;
    or any other format a ``loader`` reads (a recipe's reader of a public dataset format)."""

    path: str = Field(description="JSONL file; relative paths are resolved against the config file.")
    limit: int | None = Field(default=None, ge=1, description="Use only the first N rows.")
    loader: Annotated[str, dotted_path("recipes.hotpotqa.loader:load_tasks")] | None = Field(
        default=None,
        description="Dotted path of fn(path, limit) -> list[Task] that reads `path` instead of the JSONL "
        "reader (recipes/README.md).",
    )


class EngineConfig(_Strict):
    """Where tokens come from: the CPU dev engine started by the worker, or running SGLang servers."""

    kind: Literal["dev", "sglang"] = "dev"
    model: str = Field(
        default="tiny",
        description="dev: a tiny model (tiny, tiny-qwen3.6, tiny-deepseek-v3, tiny-mistral-nemo) or a Hugging Face model directory.",
    )
    seed: int = 0
    threads: int = Field(default=1, ge=1, description="dev: torch CPU threads.")
    urls: list[str] = Field(default_factory=list, description="sglang: base URLs of the engines.")
    served_model_name: str | None = Field(default=None, description="The model name agents request.")

    @field_validator("model")
    @classmethod
    def _model_exists(cls, v: str, info: ValidationInfo) -> str:
        """A dev engine's model is checked here, so a typo fails before anything starts."""
        from dressage.engines.tiny_model import TINY_MODELS

        if (
            info.data.get("kind", "dev") == "dev"
            and v not in TINY_MODELS
            and not (Path(v) / "config.json").is_file()
        ):
            raise ValueError(
                f"{v!r} is neither a tiny model ({', '.join(sorted(TINY_MODELS))}) nor a Hugging Face "
                "model directory (a folder with config.json)"
            )
        return v

    @model_validator(mode="after")
    def _urls(self) -> EngineConfig:
        if self.kind == "sglang" and not self.urls:
            raise ValueError("engine kind 'sglang' needs 'urls' (e.g. [http://10.0.0.5:30000])")
        if self.kind == "dev" and self.urls:
            raise ValueError("engine kind 'dev' starts its own engine; remove 'urls' or use kind 'sglang'")
        for u in self.urls:
            if not u.startswith(("http://", "https://")):
                raise ValueError(f"engine url {u!r} must start with http:// or https://")
        return self

    @property
    def model_name(self) -> str:
        """The ``model`` string agents put in their requests."""
        return self.served_model_name or ("dressage-tiny" if self.model == "tiny" else Path(self.model).name)


class ProxyConfig(_Strict):
    """The TITO proxy the worker runs in-process, or the standalone proxies it uses (``urls``)."""

    host: str = Field(default="127.0.0.1", description="Interface the in-process proxy binds (port is free).")
    context_window: int | None = Field(default=None, ge=16)
    record_experts: bool = False
    public_url: str | None = Field(
        default=None,
        description="How sandboxes with network (e2b) reach this worker's proxy; default: its local URL.",
    )
    urls: list[str] = Field(
        default_factory=list,
        description="Standalone proxies (`dressage-worker proxy`) on the run's database: the worker starts "
        "no engine or proxy and spreads sessions over them by consistent hashing (needs DRESSAGE_ADMIN_TOKEN; "
        "whitebox agents). A per-deployment choice: not part of the run's frozen config.",
    )

    @field_validator("urls")
    @classmethod
    def _proxy_urls(cls, v: list[str]) -> list[str]:
        from dressage.rollout.proxy_ring import HashRing

        try:
            if v:
                HashRing(v)  # the same checks the worker's ring makes: http(s) URLs, each once
        except ConfigError as e:
            raise ValueError(str(e)) from None
        return v


def session_seed(seed: int, task_index: int, sample_index: int, attempt: int) -> int:
    """The sampling seed of one (task, sample, attempt) session under a run's base ``seed``."""
    return (seed + 1_000_003 * task_index + 1_009 * sample_index + attempt) % (2**31 - 1)


class SamplingConfig(_Strict):
    """Request parameters whitebox agents send, and the proxy's defaults for blackbox agents.

    ``seed`` makes a run reproducible: the requests of the session for (task, sample, attempt)
    carry the seed ``seed + 1_000_003 * task_index + 1_009 * sample_index + attempt``, so the
    samples of a group differ from each other yet come out the same in a rerun. A session that a
    later attempt resumes keeps its first attempt's seed. Unset, the engine draws a seed per request.
    """

    max_tokens: int = Field(default=32, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
    enable_thinking: bool | None = Field(
        default=None,
        description="Chat-template switch sent by whitebox agents; false makes Qwen3.5 answer without <think>.",
    )

    def request_kwargs(
        self, *, task_index: int = 0, sample_index: int = 0, attempt: int = 1
    ) -> dict[str, object]:
        """Non-None fields as OpenAI request parameters, with the session's seed (see the class)."""
        out = {k: v for k, v in self.model_dump().items() if v is not None}
        if self.seed is not None:
            out["seed"] = session_seed(self.seed, task_index, sample_index, attempt)
        return out

    def engine_defaults(self) -> dict[str, object]:
        """The proxy's defaults for requests that leave them out, in SGLang's names."""
        out: dict[str, object] = {
            "max_new_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
        }
        return out


class E2BSandboxConfig(_Strict):
    """``sandbox.e2b``: which E2B template runs the Harbor tasks that have an image."""

    templates: dict[str, str] = Field(
        default_factory=dict,
        description="Harbor task name or task.toml docker_image -> E2B template id (built from the task's "
        "Dockerfile, docs/harbor.md); a task with an image and no entry is refused. Image-less tasks use "
        "sandbox.template.",
    )


class SandboxConfig(_Strict):
    """The ``sandbox:`` section; see :class:`dressage.paddock.SandboxSpec` for the meaning of fields."""

    provider: Literal["bwrap", "image", "docker", "local", "e2b"] = "bwrap"
    image: str | None = Field(
        default=None,
        description="image: the OCI image whose root filesystem is / (docker://HOST/NAME:TAG, oci:DIR[:TAG], "
        "oci-archive:TAR, docker-archive:TAR, containers-storage:[DRIVER@ROOT+RUNROOT]NAME, docker-daemon:NAME:TAG; "
        "docs/rollout.md). "
        "docker: the engine's image reference each session's container runs (e.g. python:3.12-slim). "
        "Required for a JSONL dataset; a Harbor dataset's tasks bring their own (docs/harbor.md).",
    )
    network: bool = False
    timeout_s: float = Field(default=60.0, gt=0)
    max_timeout_s: float = Field(default=600.0, gt=0)
    memory_mb: int | None = Field(default=2048, ge=16)
    max_processes: int | None = Field(default=256, ge=1)
    disk_mb: int | None = Field(
        default=1024, ge=1, description="bwrap: disk quota of the workspace and of /tmp (MiB); null: none."
    )
    output_cap_bytes: int = Field(default=64 * 1024, ge=1024)
    env: dict[str, str] = Field(default_factory=dict)
    template: str | None = Field(default=None, description="e2b: sandbox template.")
    e2b: E2BSandboxConfig = Field(default_factory=E2BSandboxConfig)
    proxy_port: int = Field(default=18080, ge=1, le=65535, description="Loopback port of the proxy inside.")
    root_dir: str | None = Field(default=None, description="bwrap, image: where workspaces are created.")
    limits: list[LimitMechanism] = Field(
        default_factory=lambda: list(DEFAULT_LIMITS),
        description="bwrap: the mechanisms accepted to enforce memory_mb and max_processes, e.g. "
        "[cgroup, rlimit]; the strongest one the machine offers is used, else the run refuses to start "
        '(docs/rollout.md "Limits").',
    )

    @field_validator("limits")
    @classmethod
    def _limits(cls, v: list[str], info: ValidationInfo) -> list[str]:
        if not v:
            raise ValueError(f"accept at least one mechanism: {', '.join(LIMIT_MECHANISMS)}")
        if len(set(v)) != len(v):
            raise ValueError(f"each mechanism once, got {v}")
        provider = info.data.get("provider", "bwrap")
        if provider not in ("bwrap", "image") and tuple(v) != DEFAULT_LIMITS:
            raise ValueError(
                f"applies to provider bwrap; {provider} enforces its own (docker: the container's cgroup, "
                "e2b: the template's VM, local: none)"
            )
        return v

    @field_validator("image")
    @classmethod
    def _image(cls, v: str | None, info: ValidationInfo) -> str | None:
        provider = info.data.get("provider", "bwrap")
        if v is not None and provider not in ("image", "docker"):
            raise ValueError(f"applies to providers image and docker (sandbox.provider is {provider})")
        if v is not None and provider == "docker":
            if not v.strip():
                raise ValueError("provider docker needs the image its containers run, e.g. python:3.12-slim")
            return v.strip()
        if v is not None:
            from dressage.paddock.image_store import check_ref

            try:
                return check_ref(v)
            except SandboxError as e:
                raise ValueError(str(e).split(" ", 1)[1]) from None
        return v

    @model_validator(mode="after")
    def _image_given(self) -> SandboxConfig:
        if self.provider == "docker" and not self.image:
            raise ValueError(
                "sandbox.image: provider docker needs the image its containers run, e.g. python:3.12-slim"
            )
        return self

    def spec(
        self, files: dict[str, str], proxy_socket: str | None, secret_env: dict[str, str] | None = None
    ) -> SandboxSpec:
        """A :class:`SandboxSpec` for one session; ``secret_env`` (run time only) joins ``env``."""
        return SandboxSpec(
            provider=self.provider,
            network=self.network,
            timeout_s=self.timeout_s,
            max_timeout_s=self.max_timeout_s,
            memory_mb=self.memory_mb,
            max_processes=self.max_processes,
            disk_mb=self.disk_mb,
            output_cap_bytes=self.output_cap_bytes,
            env={**self.env, **(secret_env or {})},
            files=dict(files),
            template=self.template,
            proxy_socket=proxy_socket,
            proxy_port=self.proxy_port,
            limits=tuple(self.limits),
            image=self.image,
        )


class WorkerConfig(_Strict):
    """How workers drive episodes; all but ``concurrency`` and the engine supervision is frozen with the run."""

    concurrency: int = Field(default=4, ge=1, le=4096)
    lease_s: float = Field(default=120.0, ge=1.0, description="Task lease; renewed every lease_s/3.")
    max_attempts: int = Field(default=3, ge=1, description="Attempts per (task, sample) before it fails.")
    session_timeout_s: float = Field(default=600.0, gt=0, description="Wall-clock limit of one agent run.")
    archive_workspace: bool = True
    poll_s: float = Field(default=0.5, gt=0, description="How often an idle worker looks for tasks.")
    resume_in_flight: bool = Field(
        default=True,
        description="An attempt interrupted by a crash or lease expiry is continued by the next one "
        "(its recorded turns replayed from the log) instead of abandoned and started again.",
    )
    engine_restarts: int = Field(
        default=3,
        ge=0,
        description="How many times the worker restarts a dev engine it started after the engine died "
        "(not frozen with the run); once spent and no engine is left, the worker stops and exits non-zero.",
    )
    engine_probe_s: float = Field(
        default=1.0,
        gt=0,
        description="How often the worker probes its engines' /health (not frozen with the run): a dead "
        "engine gets no new sessions, and its sessions continue on another engine.",
    )


class EvalConfig(_Strict):
    """The ``eval:`` section: evaluate each new policy version on a held-out dataset.

    Rollout workers enqueue the dataset's tasks as eval tasks of policy version ``v`` when they see
    ``v`` (every ``every``-th version: 0, every, 2 * every, ...) and run them like training tasks
    (same agent, sandbox and reward), first in the queue; the trainer never trains on them.
    """

    name: str = Field(
        default="eval", min_length=1, max_length=64, description="The eval set's name in reports."
    )
    dataset: DatasetConfig
    every: int = Field(default=1, ge=1, description="Evaluate policy versions 0, every, 2*every, ...")
    n_samples_per_prompt: int = Field(default=1, ge=1, le=1024, description="Attempts per eval task.")


MAX_TREE_SESSIONS = 1024
"""Sessions one tree may hold at most (the trainer numbers a tree's trajectories within it)."""


class BranchingConfig(_Strict):
    """The ``branching:`` section: each training sample grows a tree of forks (docs/trees.md).

    The sample's root session plays to its end; then each session of level ``< depth`` (the root is
    level 0) forks at its fork points into ``width`` branches, whose first ``K`` turns are replayed
    from it and whose turn ``K`` onward is sampled anew. Fork points: ``at: turns`` forks at each
    of the fixed ``turns`` past the session's own fork turn and before its last turn;
    ``at: lowest_logprob`` forks at the ``points`` turns (of the session's own) whose generated tokens
    have the lowest mean logprob (ties: the earlier turn). With ``token_budget``, no further fork
    point is opened once the tree's sessions generated that many tokens. The group the trainer
    forms holds every session of the task's trees (advantage estimator ``tree``).
    """

    width: int = Field(default=2, ge=1, le=64, description="Branches per fork point.")
    depth: int = Field(default=1, ge=1, le=8, description="Levels of forks below the root.")
    at: Literal["turns", "lowest_logprob"] = Field(
        default="turns", description="turns: the fixed `turns`; lowest_logprob: the least likely turns."
    )
    turns: list[int] | None = Field(
        default=None, description="at: turns: the fork turns K (>= 1: a branch shares turns 0..K-1)."
    )
    points: int = Field(default=1, ge=1, le=16, description="at: lowest_logprob: fork points per session.")
    token_budget: int | None = Field(
        default=None, ge=1, description="Generated tokens per tree after which no fork point opens."
    )

    @model_validator(mode="after")
    def _consistent(self) -> BranchingConfig:
        if self.at == "turns":
            if not self.turns:
                raise ValueError("at: turns needs turns: [K, ...] (the turns to fork at, each >= 1)")
            if any(k < 1 for k in self.turns) or len(set(self.turns)) != len(self.turns):
                raise ValueError(f"turns must be distinct integers >= 1, got {self.turns}")
            if self.points != 1:
                raise ValueError("points applies to at: lowest_logprob; at: turns forks at each of turns")
        elif self.turns is not None:
            raise ValueError("turns applies to at: turns; at: lowest_logprob picks its own fork turns")
        fan = self.width * (len(self.turns or ()) if self.at == "turns" else self.points)
        size = sum(fan**level for level in range(self.depth + 1))
        if size > MAX_TREE_SESSIONS:
            raise ValueError(
                f"a tree of width {self.width}, depth {self.depth} and {fan // self.width} fork point(s) per "
                f"session may hold {size} sessions; at most {MAX_TREE_SESSIONS}"
            )
        return self

    def fork_turns(self, logprobs: list[np.ndarray], own_from: int) -> list[int]:
        """The turns a session forks at: ``logprobs[i]`` are its turn ``i``'s generated logprobs,
        ``own_from`` its fork turn (0 for a root). Candidates: ``max(own_from + 1, 1) .. n - 1``."""
        candidates = range(max(own_from + 1, 1), len(logprobs))
        if self.at == "turns":
            return sorted(k for k in self.turns or () if k in candidates)
        scored = sorted((float(logprobs[k].mean()), k) for k in candidates if logprobs[k].size)
        return sorted(k for _, k in scored[: self.points])


CHECKPOINT_PROVIDERS = ("bwrap", "local", "image", "e2b")
"""Sandbox providers that take and restore checkpoints (:meth:`Sandbox.checkpoint`): host folders
(``bwrap``, ``local``), those plus the image's overlay (``image``), an E2B snapshot (``e2b``)."""


class CheckpointsConfig(_Strict):
    """The ``checkpoints:`` section: sandbox checkpoints at each turn boundary (docs/rollout.md,
    "Checkpoints"); absent: none are taken and forks and take-overs replay.

    ``keep``: ``all`` (every turn's), ``last:N`` (the newest N of each session) or ``forks`` (only the
    turns a tree rollout forks at: ``branching.at: turns``). The caps bound one checkpoint: a tree
    over them gets none at that turn (recorded, and a fork from it replays).
    """

    keep: str = Field(default="all", description="all | last:N | forks")
    max_file_mb: int = Field(default=64, ge=1, description="The largest file a checkpoint holds.")
    max_total_mb: int = Field(default=1024, ge=1, description="The most file bytes one checkpoint holds.")

    @field_validator("keep")
    @classmethod
    def _keep(cls, v: str) -> str:
        if v in ("all", "forks"):
            return v
        head, _, n = v.partition(":")
        if head != "last" or not n.isdigit() or int(n) < 1:
            raise ValueError(f"checkpoints.keep must be all, forks or last:N (N >= 1), got {v!r}")
        return v

    def to_prune(self, kept: list[int], fork_turns: list[int]) -> list[int]:
        """Which of a session's ``kept`` checkpoint turns to drop now (``fork_turns``: for ``forks``)."""
        if self.keep == "all":
            return []
        if self.keep == "forks":
            return [k for k in kept if k not in fork_turns]
        n = int(self.keep.partition(":")[2])
        return sorted(kept)[:-n] if len(kept) > n else []


class LoopConfig(_Strict):
    """The ``loop:`` section: defaults of ``dressage-worker loop`` (its options override them)."""

    iterations: int = Field(default=6, ge=1, le=10_000)
    mode: Literal["sync", "async"] = Field(
        default="sync", description="async: rollout of iteration k+1 runs while iteration k trains."
    )


class RolloutConfig(_Strict):
    """A whole ``run.yaml``."""

    run: str = Field(description="Run name: creates the run, or continues it when the config matches.")
    model_profile: str = Field(
        default="qwen3.5",
        description="TITO model profile: chat template, vocabulary, tool-call format (see docs/architecture.md).",
    )
    dataset: DatasetConfig
    n_samples_per_prompt: int = Field(default=1, ge=1, le=1024)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    proxy: ProxyConfig = Field(default_factory=ProxyConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    agent: AgentConfig = Field(default_factory=AnswerAgentConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    reward: RewardConfig = Field(default_factory=ContainsConfig)
    worker: WorkerConfig = Field(default_factory=WorkerConfig)
    secrets: SecretsConfig = Field(
        default_factory=SecretsConfig, description="Names of secrets valued from the worker's environment."
    )
    eval: EvalConfig | None = Field(default=None, description="Evaluation of each new policy version.")
    branching: BranchingConfig | None = Field(
        default=None, description="Tree rollouts: fork each sample's session into branches (docs/trees.md)."
    )
    checkpoints: CheckpointsConfig | None = Field(
        default=None, description="Sandbox checkpoints per turn (docs/rollout.md, Checkpoints); absent: off."
    )
    train: TrainConfig | None = Field(default=None, description="Training of `dressage-worker loop`.")
    loop: LoopConfig | None = Field(default=None, description="Defaults of `dressage-worker loop`.")
    ray: RayConfig | None = Field(
        default=None, description="Actor placement of `--ray` (docs/scale.md); not frozen with the run."
    )

    @field_validator("model_profile")
    @classmethod
    def _known_profile(cls, v: str) -> str:
        from dressage.tito.profiles import profile_names

        if v not in profile_names():
            raise ValueError(f"unknown model profile {v!r}; known: {', '.join(profile_names())}")
        return v

    @model_validator(mode="after")
    def _checkpoint_forks(self) -> RolloutConfig:
        if self.checkpoints is not None and self.sandbox.provider not in CHECKPOINT_PROVIDERS:
            raise ValueError(
                f"checkpoints are not built for sandbox provider {self.sandbox.provider!r} "
                f"(only {', '.join(CHECKPOINT_PROVIDERS)}); remove the checkpoints section"
            )
        if self.checkpoints is not None and self.checkpoints.keep == "forks":
            if self.branching is None or self.branching.at != "turns":
                raise ValueError(
                    "checkpoints.keep: forks keeps the turns a tree forks at, known in advance only with "
                    "branching.at: turns; use all or last:N"
                )
        return self

    @model_validator(mode="after")
    def _tree_trains_with_tree(self) -> RolloutConfig:
        if self.branching is not None and self.train is not None and self.train.advantage_estimator != "tree":
            raise ValueError(
                f"train.advantage_estimator is {self.train.advantage_estimator!r}, but a tree run "
                "(branching) trains with 'tree' (docs/trees.md)"
            )
        return self

    @model_validator(mode="after")
    def _tiny_model_family(self) -> RolloutConfig:
        from dressage.engines.tiny_model import tiny_model_profile

        family = tiny_model_profile(self.engine.model) if self.engine.kind == "dev" else None
        if family is not None and family != self.model_profile.removesuffix("-nothink").removesuffix(
            "-preserve"
        ):
            raise ValueError(
                f"engine.model {self.engine.model!r} is a tiny {family} model; model_profile is "
                f"{self.model_profile!r} (use the tiny model of that family, e.g. 'tiny-{self.model_profile}')"
            )
        return self

    @field_validator("run")
    @classmethod
    def _run_name(cls, v: str) -> str:
        if not v.strip() or len(v) > 200 or "\x00" in v:
            raise ValueError("run name must be 1-200 characters without NUL")
        return v

    def snapshot(self) -> dict[str, Any]:
        """The frozen part of a rollout: all but ``worker.concurrency`` (and the engine supervision's
        ``worker.engine_restarts``, ``worker.engine_probe_s``), ``proxy.urls`` and ``ray``
        (per-deployment choices) and the
        ``train``/``loop`` sections (the loop records those in its run's config separately); without
        an ``eval`` section the snapshot is what it was before evaluation existed."""
        exclude: dict[str, Any] = {
            "worker": {"concurrency", "engine_restarts", "engine_probe_s"},
            "proxy": {"urls"},
            "train": True,
            "loop": True,
            "ray": True,
        }
        if self.secrets == SecretsConfig():
            exclude["secrets"] = True  # snapshots of runs from before the section compare equal
        if self.eval is None:
            exclude["eval"] = True
        if getattr(self.agent, "rounds", None) == 1:
            exclude["agent"] = {"rounds"}  # likewise for runs from before multi-round answers
        if self.branching is None:
            exclude["branching"] = True  # snapshots of runs from before trees compare equal
        if self.checkpoints is None:
            exclude["checkpoints"] = True  # and from before sandbox checkpoints
        sandbox: set[str] = set()
        if self.sandbox.e2b == E2BSandboxConfig():
            sandbox.add("e2b")  # likewise for runs from before E2B templates
        if tuple(self.sandbox.limits) == DEFAULT_LIMITS:
            sandbox.add("limits")  # and from before sandbox.limits
        if self.sandbox.image is None:
            sandbox.add("image")  # and from before the image and docker providers
        if sandbox:
            exclude["sandbox"] = sandbox
        return self.model_dump(mode="json", exclude=exclude)


def _where(loc: tuple[object, ...]) -> str:
    """``('agent', 'command', 'max_turns')`` -> ``agent.max_turns`` (drops union tag segments)."""
    parts: list[str] = []
    for i, p in enumerate(loc):
        if isinstance(p, int):
            parts.append(f"[{p}]")
        elif i > 0 and loc[i - 1] in ("agent", "reward") and i == 1:
            continue  # the discriminator tag pydantic inserts
        else:
            parts.append(("." if parts else "") + str(p))
    return "".join(parts) or "(top level)"


def format_validation_error(e: ValidationError) -> str:
    """All mistakes of a validation error on one line: ``field: message; field: message``."""
    items = []
    for err in e.errors():
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; see docs/rollout.md for the fields)"
        elif err["type"] == "union_tag_invalid":
            msg = f"unknown kind {err['input'].get('kind')!r}; expected one of {err['ctx']['expected_tags']}"
        elif err["type"] == "union_tag_not_found":
            msg = "missing 'kind'"
        items.append(f"{_where(tuple(err['loc']))}: {msg}")
    n = len(items)
    return f"{n} mistake{'s' if n != 1 else ''}: " + "; ".join(items)


def parse_config(data: object, *, source: str = "config", base_dir: Path | None = None) -> RolloutConfig:
    """Validate a config mapping; resolve ``dataset.path`` against ``base_dir``."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of sections (run, dataset, agent, ...)")
    try:
        cfg = RolloutConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{source}: {format_validation_error(e)}") from None
    try:
        check_no_cleartext_secrets(cfg.sandbox.env, "sandbox.env")
        check_no_cleartext_secrets(getattr(cfg.agent, "env", {}), "agent.env")
        check_config_has_no_secrets(cfg.snapshot())
        resolve_secrets(cfg.secrets)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    if base_dir is not None and not Path(cfg.dataset.path).is_absolute():
        path = str((base_dir / cfg.dataset.path).resolve())
        cfg = cfg.model_copy(update={"dataset": cfg.dataset.model_copy(update={"path": path})})
    if base_dir is not None and cfg.eval is not None and not Path(cfg.eval.dataset.path).is_absolute():
        path = str((base_dir / cfg.eval.dataset.path).resolve())
        dataset = cfg.eval.dataset.model_copy(update={"path": path})
        cfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"dataset": dataset})})
    return cfg


def load_config(path: str | Path) -> RolloutConfig:
    """Read and validate a YAML rollout config; every problem is a :class:`ConfigError`."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {p}: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{p}: invalid YAML{where}: {problem}") from None
    return parse_config(data, source=str(p), base_dir=p.parent.resolve())
