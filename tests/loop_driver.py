"""One driver for the drills that run ``dressage-worker loop`` in the test process: build the
:class:`~dressage.loop.runner.Loop`, run every iteration, stop it (tests/loop, the Harbor and replica
drills)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from dressage.config import Settings
from dressage.loop.runner import Loop, LoopOptions
from dressage.store import EventStore


def drive_loop(
    store: EventStore,
    settings: Settings,
    config: Path,
    out_dir: Path,
    *,
    quiet: bool = False,
    on_start: Callable[[Loop], None] | None = None,
    on_done: Callable[[Loop], Awaitable[Any]] | None = None,
) -> tuple[Loop, Any]:
    """Run the loop of ``config`` on ``store`` to its last iteration; return it (stopped) and what
    ``on_done`` returned. ``on_start`` sees the started loop before its first iteration, ``on_done``
    the loop after its last one, both while its engine, proxy and workers are still up."""
    loop = Loop(store, settings, LoopOptions(str(config), out_dir=out_dir), Console(quiet=quiet))

    async def go() -> Any:
        async with loop:
            if on_start is not None:
                on_start(loop)
            await loop.run_all(show_progress=False)
            return None if on_done is None else await on_done(loop)

    return loop, asyncio.run(go())
