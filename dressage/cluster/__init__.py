"""Past one machine: a run's rollout workers, proxies and dev engine as actors of a Ray cluster.

``dressage-worker rollout --ray ADDRESS`` and ``loop --ray ADDRESS`` (and slime's rollout function,
:mod:`dressage.integrations.slime`) place them; see docs/scale.md. Ray is an optional extra: this
package's ``__init__``, :mod:`dressage.cluster.layout` and the ``ray:`` section (:mod:`dressage.rollout.ray_config`) never
import it, :func:`ray_rollout_module` imports it on demand and says how to install it when it is missing.
"""

from __future__ import annotations

from types import ModuleType

from dressage.errors import NotSupportedError

RAY_INSTALL_HINT = "pip install 'dressage[ray]' (Ray 2.60, `ray[default]`)"


def ray_rollout_module() -> ModuleType:
    """:mod:`dressage.cluster.ray_rollout`, or a :class:`NotSupportedError` saying how to install Ray."""
    try:
        import ray  # noqa: F401
    except ImportError as e:
        raise NotSupportedError(
            f"--ray needs Ray, which is not installed here ({e}); {RAY_INSTALL_HINT}"
        ) from None
    from dressage.cluster import ray_rollout
    from dressage.harbor.kind import register

    register()  # the driver (dressage-worker or slime's process) loads the run's tasks: built-in kinds
    return ray_rollout
