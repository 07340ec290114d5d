"""The fork tree of a session (``dressage-worker fork``), as SVG geometry for the template.

One lane per session (y), in depth-first order from the root; x is the turn index. Each session is
a bar from its fork turn (0 for the root) to its last turn, ending in a node; a fork is an edge
from its parent's bar at the fork turn down to the child's bar. Every node, a forked one as well
as a leaf, is coloured by its session's reward, from red (0 or less) to green (1 or more); grey
only without a reward. The drawing is as wide as its longest label needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dressage.store.records import Session

LANE = 34
TOP = 24
LEFT = 16
MAX_WIDTH = 900
LABEL_ROOM = 260
LABEL_GAP = 10
"""Between a node and its label (tree.html writes it as x1 + 10)."""
CHAR_PX = 6.2
"""Width of a label character at the page's 10px label font, rounded up (hex ids and digits)."""


@dataclass
class TreeNode:
    """One session's bar and node."""

    session: Session
    depth: int
    turns: int
    y: int
    x0: int
    x1: int
    leaf: bool
    fill: str
    label: str


@dataclass
class TreeDiagram:
    """Everything the SVG needs (coordinates in pixels)."""

    width: int
    height: int
    nodes: list[TreeNode] = field(default_factory=list)
    edges: list[dict[str, int]] = field(default_factory=list)


def reward_fill(reward: float | None) -> str:
    """A node's colour: red (reward <= 0) to green (reward >= 1); grey when it has none."""
    if reward is None:
        return "#9aa0a6"
    share = min(max(reward, 0.0), 1.0)
    return f"hsl({round(120 * share)}, 65%, 42%)"


def tree_diagram(sessions: list[Session], turns: dict[str, int]) -> TreeDiagram:
    """The diagram of a fork tree (``sessions`` root first, parents before children; ``turns``:
    each session's recorded turn count)."""
    longest = max([turns.get(s.id, 0) for s in sessions] + [1])
    step = max(6, min(60, (MAX_WIDTH - LEFT - LABEL_ROOM) // longest))
    d = TreeDiagram(width=LEFT + step * longest + LABEL_ROOM, height=TOP + LANE * len(sessions))
    lane = {s.id: TOP + i * LANE for i, s in enumerate(sessions)}
    parents = {s.parent_session_id for s in sessions}
    depth: dict[str, int] = {}
    for s in sessions:
        parent = s.parent_session_id if s.parent_session_id in lane else None
        depth[s.id] = depth[parent] + 1 if parent is not None else 0
        start = (s.fork_turn or 0) if parent is not None else 0
        n = turns.get(s.id, 0)
        leaf = s.id not in parents
        reward = "" if s.reward is None else f" · reward {s.reward:g}"
        fork = f" · fork at turn {s.fork_turn}" if parent is not None else ""
        d.nodes.append(
            TreeNode(
                session=s,
                depth=depth[s.id],
                turns=n,
                y=lane[s.id],
                x0=LEFT + start * step,
                x1=LEFT + max(n, start) * step,
                leaf=leaf,
                fill=reward_fill(s.reward),
                label=f"{s.id[:12]} · {s.status} · {n} turns{fork}{reward}",
            )
        )
        if parent is not None:
            d.edges.append({"x": LEFT + start * step, "y1": lane[parent], "y2": lane[s.id]})
    d.width = max([d.width] + [label_end(n) + LEFT for n in d.nodes])
    return d


def label_end(node: TreeNode) -> int:
    """Where ``node``'s label ends (its text starts :data:`LABEL_GAP` right of its circle)."""
    return round(node.x1 + LABEL_GAP + CHAR_PX * len(node.label))
