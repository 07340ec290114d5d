"""What enforces a sandbox's memory and process limits, and the refusal when nothing accepted can.

A run's ``sandbox.limits`` lists the mechanisms it accepts for ``memory_mb`` and ``max_processes``
(bwrap); the provider uses the strongest accepted one this machine offers, or refuses to start:

- ``cgroup``: a cgroup per sandbox (``pids.max`` and the memory controller, v1 or v2): holds for
  every process of the sandbox together, whoever runs the worker. The default, and the only one
  accepted unless the config names another.
- ``rlimit``: ``RLIMIT_NPROC`` and ``RLIMIT_AS`` (per process). The kernel exempts host root from
  ``RLIMIT_NPROC``, so a root worker runs each such sandbox as a host uid of its own (never 0):
  the count is then the sandbox's alone. A non-root worker's sandboxes run as its own uid, whose
  every process and thread (the worker's included) counts against the limit.

Other providers say what holds there: ``e2b-template`` (the E2B template's VM size) and ``none``
(``local`` isolates nothing). The mechanism in force is printed when a run starts and recorded in
its snapshot (``sandbox_limits``); see docs/rollout.md "Limits".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

from dressage.errors import SandboxError, SandboxUnavailableError

MIB = 1024 * 1024

#: A mechanism ``sandbox.limits`` may accept (bwrap).
LimitMechanism = Literal["cgroup", "rlimit"]
#: All of them, strongest first.
LIMIT_MECHANISMS: tuple[LimitMechanism, ...] = get_args(LimitMechanism)
#: What a config accepts when it says nothing: only the mechanism that holds for root too.
DEFAULT_LIMITS: tuple[LimitMechanism, ...] = ("cgroup",)


@dataclass(frozen=True)
class LimitsInForce:
    """The mechanism that enforces a sandbox's limits (recorded with the run) and how, in words."""

    mechanism: str
    detail: str

    def line(self) -> str:
        """The one line a run prints at start."""
        return f"sandbox limits: {self.mechanism} ({self.detail})"


def configured_limits(memory_mb: int | None, max_processes: int | None) -> str:
    """The configured limits in the config's words, e.g. ``max_processes 64 and memory_mb 1024``."""
    parts = [f"max_processes {max_processes}"] if max_processes is not None else []
    parts += [f"memory_mb {memory_mb}"] if memory_mb is not None else []
    return " and ".join(parts)


def refusal(limits: str, accepted: tuple[str, ...], missing: str, fix: str) -> SandboxUnavailableError:
    """The one-line error of a sandbox whose limits no accepted mechanism can enforce here.

    ``missing`` says which mechanism is missing and why, ``fix`` what to do about it.
    """
    return SandboxUnavailableError(
        f"sandbox limits refused: {limits} need {missing}; sandbox.limits accepts "
        f'[{", ".join(accepted)}]: {fix} (docs/rollout.md "Limits")'
    )


class DiskQuota:
    """A sandbox's ``sandbox.disk_mb``, checked after each command: once the workspace is over it,
    that command and every later one are refused (the usage that went over is kept, not re-measured).

    ``used`` measures what the provider counts (the workspace, and an image sandbox's overlay).
    """

    def __init__(self, session_id: str, disk_mb: int | None, used: Callable[[], int]) -> None:
        self.session_id = session_id
        self.disk_mb = disk_mb
        self._used = used
        self._over = 0

    def check(self) -> None:
        """Raise :class:`SandboxError` when the workspace is (or was once) over the quota."""
        if not self.disk_mb:
            return
        used = self._over or self._used()
        if used > self.disk_mb * MIB:
            self._over = used
            raise SandboxError(
                f"sandbox {self.session_id}: the workspace holds {used / MIB:.0f} MiB, over its disk quota "
                f"of {self.disk_mb} MiB (sandbox.disk_mb); no further commands run in it"
            )
