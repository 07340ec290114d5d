"""The threads-and-segments diagram of a session, as SVG geometry for the template.

One lane per thread (agent context, y), one column per turn (x). Each turn is a dot coloured by its segment;
turns of a segment are joined by a line; a branch (retry) draws an arrow from the turn it restarts
from, a new context (compaction, subagent) a dashed arrow from the turn before it; a dead-end
(abandoned) segment is hollow. Each segment's first turn carries its boundary reason as a label.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dressage.store.records import Turn

LANE = 44
TOP = 28
LEFT = 90
MAX_WIDTH = 1000


@dataclass
class Diagram:
    """Everything the SVG needs (coordinates in pixels)."""

    width: int
    height: int
    lanes: list[tuple[int, int]] = field(default_factory=list)  # (thread, y)
    dots: list[dict[str, object]] = field(default_factory=list)
    lines: list[dict[str, object]] = field(default_factory=list)
    labels: list[dict[str, object]] = field(default_factory=list)


def session_diagram(turns: list[Turn]) -> Diagram:
    """The diagram of one session's turns (in turn order)."""
    threads = sorted({t.thread_index for t in turns}) or [0]
    lane_y = {lin: TOP + i * LANE for i, lin in enumerate(threads)}
    n = max(len(turns), 1)
    step = max(8, min(90, (MAX_WIDTH - LEFT - 20) // n))
    d = Diagram(width=LEFT + step * n + 140, height=TOP + LANE * len(threads) + 10)
    d.lanes = [(lin, y) for lin, y in lane_y.items()]
    pos = {t.id: (LEFT + i * step + step // 2, lane_y[t.thread_index]) for i, t in enumerate(turns)}
    by_index = {t.turn_index: t for t in turns}
    last_in_segment: dict[int, Turn] = {}
    for i, t in enumerate(turns):
        x, y = pos[t.id]
        dead = t.boundary_reason == "client_disconnected"
        d.dots.append(
            {
                "x": x,
                "y": y,
                "turn": t.turn_index,
                "segment": t.segment_index,
                "cls": f"seg-{t.segment_index % 8}" + (" dead" if dead else ""),
                "title": f"turn {t.turn_index} · segment {t.segment_index} · thread {t.thread_index} · "
                f"{t.route}" + (f" ({t.boundary_reason})" if t.boundary_reason else ""),
            }
        )
        prev = last_in_segment.get(t.segment_index)
        if prev is not None:
            px, py = pos[prev.id]
            d.lines.append({"x1": px, "y1": py, "x2": x, "y2": y, "cls": f"seg-{t.segment_index % 8}"})
        elif i > 0:
            parent = next((p for p in turns if p.id == t.parent_turn_id), None)
            source = parent if parent is not None else by_index.get(t.turn_index - 1)
            if source is not None:
                px, py = pos[source.id]
                kind = "branch" if t.route == "branch" else "create"
                # an edge within one lane arcs above it, so it does not run over the dots between
                bend = -0.6 * LANE if py == y else 0.0
                path = f"M {px} {py} Q {(px + x) / 2:.0f} {(py + y) / 2 + bend:.0f} {x} {y}"
                d.lines.append({"x1": px, "y1": py, "x2": x, "y2": y, "path": path, "cls": f"edge-{kind}"})
            below = len(d.labels) % 2 == 1
            d.labels.append(
                {"x": x + 6, "y": y + 16 if below else y - 9, "text": t.boundary_reason or t.route}
            )
        last_in_segment[t.segment_index] = t
    return d
