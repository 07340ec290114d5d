"""The RL loop: rollout, train, push new weights, repeat (``dressage-worker loop``)."""

from dressage.loop.runner import Loop, LoopOptions, LoopReport, run_loop

__all__ = ["Loop", "LoopOptions", "LoopReport", "run_loop"]
