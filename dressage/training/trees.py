"""Training on trajectory trees: node values, per-token advantages, shared tokens trained once.

A tree rollout (docs/trees.md) forks sessions: a child session has ``parent_session_id`` and
``fork_turn = K``, and its turns ``0 .. K-1`` are its own rows holding the parent's turns id for id
(replayed, no engine call); its turns ``K ..`` are live. The trainer sees one group (every session
under the group's roots) and treats a turn shared by several sessions as **one node**, trained once,
at the session that generated it.

**Nodes.** The *owner* of turn ``i`` of session ``s`` is ``s`` when ``i >= fork_turn(s)`` (or ``s``
is a root), else the owner of turn ``i`` of its parent. The *leaves* of a turn are the finished
sessions that hold it (the owner and every descendant forked after it). A node is a maximal run of
one owner's consecutive turns with the same leaves; its parent node holds the turn before its
first turn (on the owner's parent when the node starts at the owner's fork turn); a node that
starts at turn 0 hangs under the group's virtual root.

**Estimator** (the local advantage of TreeRL, Hou et al., "TreeRL: LLM Reinforcement Learning with
On-Policy Tree Search", ACL 2025, arXiv:2506.11902, section 3.2): a node's value is the mean reward
of the leaves below it, ``V(n) = mean_{l in leaves(n)} R_l``; the virtual root's value is the mean
reward of every finished session of the group; every token of node ``n`` gets

    A(n) = V(n) - V(parent(n))

(with ``std_normalize``: divided by ``std(R) + eps`` over the group's leaves, population std).
TreeRL adds a global term ``V(n) - V(root)`` and divides by ``sqrt(|leaves(n)|)``; we keep the
local term alone, so a group without forks gets exactly GRPO's ``R - mean(R)``.

**Trained once.** Each node is trained in exactly one session's samples: its owner when the owner
finished, else its first leaf (by depth, then session id). In every other session holding the
node, its tokens are masked with reason :data:`TREE_SHARED` (counted per sample as
``masking["masked_tree_shared"]``), so prompt-equal loss weights count a shared token once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from dressage.errors import TrainingError
from dressage.store.records import Turn
from dressage.training.groups import ReadyGroup
from dressage.training.masking import MASK_CODES
from dressage.training.samples import TrainSample

TREE_SHARED = "tree_shared"
"""The mask reason of a token a tree trains in another session (the node's trained copy);
:data:`~dressage.training.masking.MASK_REASONS` holds it."""

GROUP_ROOT = -1
"""The parent index of a node that starts at turn 0: the group's virtual root."""


@dataclass(frozen=True)
class TreeSession:
    """One session of a group's tree: where it forked from and how it ended."""

    session_id: str
    parent_session_id: str | None
    fork_turn: int | None
    status: str
    reward: float | None
    n_turns: int

    @property
    def finished(self) -> bool:
        """Whether the session is a leaf with a reward."""
        return self.status == "finished" and self.reward is not None


@dataclass(frozen=True)
class TreeNode:
    """Turns ``[first_turn, end_turn)`` of ``owner``, shared by ``leaves``."""

    owner: str
    first_turn: int
    end_turn: int
    leaves: tuple[str, ...]
    parent: int  # index of the parent node, or GROUP_ROOT
    value: float
    advantage: float
    trained_in: str  # the session whose samples train this node

    def describe(self) -> dict[str, object]:
        """For the step manifest."""
        return {
            "owner": self.owner,
            "turns": [self.first_turn, self.end_turn],
            "leaves": list(self.leaves),
            "parent": self.parent,
            "value": self.value,
            "advantage": self.advantage,
            "trained_in": self.trained_in,
        }


@dataclass(frozen=True)
class Tree:
    """A group's nodes and, per finished session, the node of each of its turns."""

    nodes: tuple[TreeNode, ...]
    root_value: float
    node_of: Mapping[tuple[str, int], int]  # (session, turn index) -> node index

    def describe(self) -> dict[str, object]:
        """For the step manifest: the root value and every node."""
        return {"root_value": self.root_value, "nodes": [n.describe() for n in self.nodes]}


class _Forest:
    """The sessions of one group with their fork links (parents outside the group make roots)."""

    def __init__(self, sessions: Sequence[TreeSession]) -> None:
        self.by_id = {s.session_id: s for s in sessions}
        if len(self.by_id) != len(sessions):
            raise TrainingError("a session appears twice in one tree group")
        self.depth: dict[str, int] = {}
        for s in sessions:
            self._depth_of(s.session_id, ())

    def parent(self, sid: str) -> str | None:
        p = self.by_id[sid].parent_session_id
        return p if p in self.by_id else None

    def _depth_of(self, sid: str, seen: tuple[str, ...]) -> int:
        if sid in seen:
            raise TrainingError(f"session {sid} is its own ancestor (fork cycle)")
        if sid not in self.depth:
            p = self.parent(sid)
            self.depth[sid] = 0 if p is None else self._depth_of(p, (*seen, sid)) + 1
        return self.depth[sid]

    def owner(self, sid: str, turn: int) -> str:
        """The session that generated turn ``turn`` of session ``sid``."""
        while True:
            s, p = self.by_id[sid], self.parent(sid)
            if p is None or s.fork_turn is None or turn >= s.fork_turn:
                return sid
            sid = p


def build_tree(sessions: Sequence[TreeSession], *, std_normalize: bool = False, eps: float = 1e-6) -> Tree:
    """The group's nodes with values and advantages (see the module docstring)."""
    forest = _Forest(sessions)
    leaves_of: dict[tuple[str, int], list[str]] = {}
    finished = sorted((s for s in sessions if s.finished), key=lambda s: s.session_id)
    for leaf in finished:
        for turn in range(leaf.n_turns):
            leaves_of.setdefault((forest.owner(leaf.session_id, turn), turn), []).append(leaf.session_id)
    rewards = {s.session_id: float(s.reward) for s in finished if s.reward is not None}
    scale = 1.0
    if std_normalize and rewards:
        scale = 1.0 / (float(np.std(np.asarray(list(rewards.values()), dtype=np.float64))) + eps)
    root_value = float(np.mean(list(rewards.values()))) if rewards else 0.0
    spans = _spans(leaves_of)
    node_of: dict[tuple[str, int], int] = {}
    for k, (owner, first, end, _) in enumerate(spans):
        for turn in range(first, end):
            node_of[(owner, turn)] = k
    nodes: list[TreeNode] = []
    for owner, first, end, leaves in spans:
        value = float(np.mean([rewards[x] for x in leaves]))
        parent = GROUP_ROOT if first == 0 else node_of[(forest.owner(leaves[0], first - 1), first - 1)]
        parent_value = root_value if parent == GROUP_ROOT else nodes[parent].value
        trained_in = owner if owner in rewards else min(leaves, key=lambda x: (forest.depth[x], x))
        nodes.append(
            TreeNode(owner, first, end, leaves, parent, value, (value - parent_value) * scale, trained_in)
        )
    by_turn = {
        (leaf.session_id, turn): node_of[(forest.owner(leaf.session_id, turn), turn)]
        for leaf in finished
        for turn in range(leaf.n_turns)
    }
    return Tree(tuple(nodes), root_value, by_turn)


def _spans(leaves_of: Mapping[tuple[str, int], list[str]]) -> list[tuple[str, int, int, tuple[str, ...]]]:
    """Maximal runs of one owner's consecutive turns with the same leaves, parents before children.

    Sorted by first turn, so a node's parent (which holds an earlier turn) always comes first.
    """
    by_owner: dict[str, list[int]] = {}
    for owner, turn in leaves_of:
        by_owner.setdefault(owner, []).append(turn)
    spans: list[tuple[str, int, int, tuple[str, ...]]] = []
    for owner, turns in by_owner.items():
        turns.sort()
        start = turns[0]
        for prev, turn in zip(turns, [*turns[1:], -1], strict=True):
            if turn != prev + 1 or leaves_of[(owner, turn)] != leaves_of[(owner, prev)]:
                spans.append((owner, start, prev + 1, tuple(leaves_of[(owner, prev)])))
                start = turn
    return sorted(spans, key=lambda x: (x[1], x[0]))


def apply_tree(tree: Tree, samples: Sequence[TrainSample], turns: Mapping[str, Sequence[Turn]]) -> None:
    """Set each sample's per-token ``advantages`` and mask the tokens another session trains.

    ``samples`` are the materialized samples of the group's finished sessions (version masking
    already applied); ``turns`` their turns by session. A sample's scalar ``advantage`` becomes its
    session's last node's (the leaf's).
    """
    for s in samples:
        by_id = {t.id: t for t in turns.get(s.session_id, ())}
        turn_R = _turn_of_response(s, by_id)
        node_R = np.asarray([tree.node_of[(s.session_id, i)] for i in turn_R], dtype=np.int64)
        adv_N = np.asarray([n.advantage for n in tree.nodes], dtype=np.float32)
        s.advantages = adv_N[node_R]
        elsewhere_R = np.asarray([tree.nodes[k].trained_in != s.session_id for k in node_R], dtype=np.bool_)
        keep_R = s.loss_mask.astype(np.bool_)
        s.masking = {**s.masking, f"masked_{TREE_SHARED}": int((keep_R & elsewhere_R).sum())}
        if s.mask_reasons is not None:
            s.mask_reasons = s.mask_reasons.copy()
            s.mask_reasons[keep_R & elsewhere_R] = MASK_CODES[TREE_SHARED]
        s.loss_mask = (keep_R & ~elsewhere_R).astype(np.int32)
        s.masking["trainable"] = int(s.loss_mask.sum())
        last = max(i for (sid, i) in tree.node_of if sid == s.session_id)
        s.advantage = float(tree.nodes[tree.node_of[(s.session_id, last)]].advantage)


def _turn_of_response(sample: TrainSample, turns_by_id: Mapping[str, Turn]) -> np.ndarray:
    """The turn index of each response token of ``sample`` (from the turns' segment offsets)."""
    length = int(sample.tokens.shape[0])
    turn_L = np.full(length, -1, dtype=np.int64)
    for tid in sample.turn_ids:
        turn = turns_by_id.get(tid)
        if turn is None:
            raise TrainingError(f"session {sample.session_id}: turn {tid} of a sample was not read")
        n = int(turn.context_ids.size + turn.generated_ids.size)
        turn_L[turn.segment_offset : turn.segment_offset + n] = turn.turn_index
    turn_R = turn_L[sample.response_start :]
    if (turn_R < 0).any():
        raise TrainingError(
            f"session {sample.session_id} segment {sample.segment_index}: tokens without a turn"
        )
    return turn_R


TREE_ID_STRIDE = 1024
"""Rollout ids per tree: a tree's sessions take ``(group * n + sample) * TREE_ID_STRIDE + k``
(``k`` = 0 for the root, 1, 2, ... for its forks breadth first, each parent's in start order), so each session is one trajectory."""


def tree_sessions(group: ReadyGroup) -> list[TreeSession]:
    """The group's members and forks as :class:`TreeSession` s (turn counts 0: set them once read)."""
    out = [
        TreeSession(m.session_id, None, None, m.status, m.reward, 0)
        for m in group.members
        if m.session_id is not None
    ]
    out += [
        TreeSession(f.session_id, f.parent_session_id, f.fork_turn, f.status, f.reward, 0)
        for f in group.forks
    ]
    return out


def tree_rollout_ids(group: ReadyGroup, n_samples_per_prompt: int) -> dict[str, int]:
    """Each session's rollout id (see :data:`TREE_ID_STRIDE`); a tree too big for it is a TrainingError."""
    ids: dict[str, int] = {}
    next_k: dict[str, int] = {}
    root_of: dict[str, str] = {}
    for m in group.members:
        if m.session_id is not None:
            ids[m.session_id] = (group.group_index * n_samples_per_prompt + m.sample_index) * TREE_ID_STRIDE
            root_of[m.session_id], next_k[m.session_id] = m.session_id, 1
    for f in group.forks:
        root = root_of[f.parent_session_id]
        if next_k[root] >= TREE_ID_STRIDE:
            raise TrainingError(f"the tree of session {root} has more than {TREE_ID_STRIDE} sessions")
        ids[f.session_id] = ids[root] + next_k[root]
        root_of[f.session_id], next_k[root] = root, next_k[root] + 1
    return ids


def node_samples(sample: TrainSample) -> list[TrainSample]:
    """``sample`` as samples with one scalar advantage each, for consumers without per-token ones.

    slime's ``Sample`` has one ``reward`` per sample (dressage writes the advantage there). A tree
    sample with per-token ``advantages`` becomes one sample per run of trained tokens sharing an
    advantage (a node): its tokens up to the run's last token, its response from the run's first
    token, trained only there, with that advantage. Each trained token stays trained exactly once,
    so the step's loss (a weighted token sum) is unchanged. A sample without per-token advantages
    is returned as is.
    """
    adv_R = sample.advantages
    trained = np.flatnonzero(sample.loss_mask)
    if adv_R is None:
        return [sample]
    if trained.size == 0:
        return [replace(sample, advantages=None)]
    cuts = np.flatnonzero(adv_R[trained][1:] != adv_R[trained][:-1]) + 1
    runs = np.split(trained, cuts)
    out: list[TrainSample] = []
    for k, run in enumerate(runs):
        r0, r1 = int(run[0]), int(run[-1]) + 1
        end = sample.response_start + r1
        experts = sample.rollout_routed_experts
        out.append(
            replace(
                sample,
                tokens=sample.tokens[:end],
                response_length=r1 - r0,
                loss_mask=sample.loss_mask[r0:r1],
                rollout_log_probs=sample.rollout_log_probs[r0:r1],
                rollout_routed_experts=None if experts is None else experts[: end - 1],
                is_anchor=sample.is_anchor and k == len(runs) - 1,
                policy_versions=sample.policy_versions[r0:r1],
                stored_loss_mask=sample.stored_loss_mask[r0:r1],
                advantage=float(adv_R[r0]),
                advantages=None,
                loss_weights=None if sample.loss_weights is None else sample.loss_weights[r0:r1],
            )
        )
    return out
