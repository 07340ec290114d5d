"""Rollout: config (``run.yaml``), datasets, rewards, episodes and the worker loop behind
``dressage-worker rollout``. See docs/rollout.md.

Import the submodules directly (``dressage.rollout.worker``, ``dressage.rollout.config``); this
package keeps its import light so the CLI starts fast.
"""
