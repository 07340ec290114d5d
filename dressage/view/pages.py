"""The data of each page, shared by the server and the static bundle.

Each ``*_page`` function reads what one page shows and returns the template's context (without
the URL helper, which the caller adds). Untrusted text (model output, tool output, errors, names)
goes to templates as plain strings: Jinja escapes it, and the token view's JSON is embedded with
``tojson`` (``<``, ``>``, ``&`` and quotes escaped), so nothing from the log can become markup.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from dressage.errors import RequestError, UnknownRunError, UnknownSessionError
from dressage.paddock.workspace_diffs import DiffCaps, session_changes, turn_diffs
from dressage.redact import redact
from dressage.store import EventStore
from dressage.store.records import Run, Session
from dressage.view import queries
from dressage.view.conversation import Message, turn_views
from dressage.view.decode import TokenDecoder, profile_decoder
from dressage.view.diagram import session_diagram
from dressage.view.listing import SessionQuery, list_sessions
from dressage.view.tokens import segment_summaries, token_payload
from dressage.view.tree import tree_diagram


@dataclass
class Viewer:
    """What every page needs: the read-only store and the token decoder."""

    store: EventStore
    decoder: TokenDecoder

    def decoder_for(self, run: Run) -> TokenDecoder:
        """The decoder of the model profile ``run`` recorded (``decoder`` for Qwen3.5 or no record)."""
        return profile_decoder(run.config) or self.decoder

    def redact(self, text: str | None) -> str | None:
        """``text`` with secrets replaced (the store's configured secrets and the usual patterns)."""
        return redact(text, self.store.db.secrets)


def runs_page(v: Viewer) -> dict[str, object]:
    """Every run with its counts."""
    return {"runs": [queries.run_overview(v.store, r) for r in v.store.runs.list()]}


def run_page(
    v: Viewer, run_name: str, params: dict[str, str], *, all_sessions: bool = False
) -> dict[str, Any]:
    """A run: counts, reward curves, failures and one page of its sessions."""
    run = v.store.runs.get(run_name)
    q = SessionQuery.from_params({k: val for k, val in params.items() if k != "name"})
    if all_sessions:
        q = SessionQuery(per_page=10**9)
    table = list_sessions(v.store, run.name, q, v.decoder_for(run))
    for row in table.rows:
        row["error"] = v.redact(row.get("error"))
    consumer_names = queries.consumers(v.store, run)
    step_curves = {
        c: [p for s in queries.steps(v.store, run, c) if (p := queries.step_rewards(s)) is not None]
        for c in consumer_names
    }
    by_version = queries.reward_by_version(v.store, run)
    eval_version = queries.eval_by_version(v.store, run)
    return {
        "overview": queries.run_overview(v.store, run),
        "failures": queries.failures(v.store, run),
        "table": table,
        "consumers": consumer_names,
        "curves": {
            "by_version": [[p.x, p.mean_reward, p.n] for p in by_version],
            "eval_by_version": [[p.x, p.mean_reward, p.n] for p in eval_version],
            "by_step": {c: [[p.x, p.mean_reward, p.n] for p in pts] for c, pts in step_curves.items()},
        },
        "versions": _version_rows(by_version, eval_version),
        "groups": _group_indices(table.rows),
        "config": v.redact(_pretty(run.config)),
    }


def _version_rows(
    train: list[queries.CurvePoint], evals: list[queries.CurvePoint]
) -> list[dict[str, object]]:
    """One row per policy version: training and eval mean reward (and session counts) side by side."""
    by_x: dict[int, dict[str, object]] = {}
    for name, points in (("train", train), ("eval", evals)):
        for p in points:
            by_x.setdefault(p.x, {"version": p.x, "train": None, "eval": None})[name] = p
    return [by_x[x] for x in sorted(by_x)]


def _group_indices(rows: list[dict[str, Any]]) -> list[int]:
    return sorted({int(r["group"]) for r in rows if r.get("group") is not None and r.get("kind") != "eval"})


def _pretty(value: object) -> str:
    import json

    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def _redact_message(v: Viewer, m: Message) -> Message:
    return Message(
        m.role,
        v.redact(m.content) or "",
        v.redact(m.reasoning),
        [
            {**c, "function": {**c["function"], "arguments": v.redact(c["function"]["arguments"])}}
            for c in m.tool_calls
        ],
        m.tool_call_failures,
    )


def session_page(v: Viewer, session_id: str) -> dict[str, object]:
    """A session: conversation, token view, segments diagram, reward, artifacts, steps, events."""
    session = v.store.sessions.get(session_id)
    run = v.store.runs.by_id(session.run_id)
    turns = v.store.turns.read(session_id=session_id, with_experts=False)
    views = turn_views(turns, v.decoder_for(run))
    for tv in views:
        tv.context_messages = [_redact_message(v, m) for m in tv.context_messages]
        tv.reply = _redact_message(v, tv.reply) if tv.reply is not None else None
    events = queries.session_events(v.store, run, session_id)
    reward_events = [e for e in events if e["kind"] == "reward"]
    decisions = v.store.consumers.session_decisions(session_id)
    return {
        "session": session,
        "forks": fork_links(v, session),
        "error": v.redact(session.error),
        "run": run,
        "task": queries.task_of(v.store, session),
        "turns": views,
        "segments": segment_summaries(turns),
        "diagram": session_diagram(turns),
        "tokens": token_payload(
            turns,
            v.decoder_for(run),
            v.store.db.secrets,
            with_experts=queries.turns_with_experts(v.store, session_id),
            decisions=decisions,
            nodes=queries.tree_nodes_of_session(v.store, run, session_id, decisions),
        ),
        "events": [{**e, "payload": v.redact(_pretty(e["payload"]))} for e in events],
        "reward_details": v.redact(_pretty(reward_events[-1]["payload"].get("details")))
        if reward_events
        else None,
        "artifacts": v.store.artifacts.list(run, session_id=session_id),
        "steps": queries.steps_of_session(v.store, run, session_id),
        "files": workspace_files(v, session_id),
        "last_position": v.store.events.last_position(run),
        "totals": {
            "tokens": sum(t.context_ids.size + t.generated_ids.size for t in turns),
            "trained": sum(int(t.loss_mask.sum()) for t in turns),
        },
    }


def tree_page(v: Viewer, session_id: str) -> dict[str, object]:
    """The fork tree ``session_id`` belongs to (``dressage-worker fork``), drawn from its root."""
    sessions = v.store.sessions.tree(session_id)
    root = sessions[0]
    turns = {s.id: v.store.sessions.head(s.id).turns for s in sessions}
    return {"root": root, "run": v.store.runs.by_id(root.run_id), "diagram": tree_diagram(sessions, turns)}


def fork_links(v: Viewer, session: Session) -> dict[str, object]:
    """A session's place among forks: its parent (if in the log) and fork turn, its children."""
    parent: Session | None = None
    if session.parent_session_id is not None:
        try:
            parent = v.store.sessions.get(session.parent_session_id)
        except UnknownSessionError:
            parent = None
    return {"parent": parent, "children": v.store.sessions.children(session.id)}


def sql_page(v: Viewer, session_id: str) -> dict[str, object]:
    """The SQL behind a session page."""
    session = v.store.sessions.get(session_id)
    return {"session": session, "sql": queries.session_sql(session_id)}


def conversation_text(v: Viewer, session: Session) -> list[str]:
    """A session's conversation as lines of text (what the group diff compares)."""
    turns = v.store.turns.read(session_id=session.id, with_experts=False)
    lines: list[str] = []
    for tv in turn_views(turns, v.decoder_for(v.store.runs.by_id(session.run_id))):
        for m in [*tv.context_messages, *([tv.reply] if tv.reply else [])]:
            lines.append(f"[{m.role}]")
            if m.reasoning:
                lines += ["(thinking) " + x for x in m.reasoning.splitlines()]
            lines += m.content.splitlines()
            for c in m.tool_calls:
                lines.append(f"(tool call) {c['function']['name']} {c['function']['arguments']}")
    return [v.redact(x) or "" for x in lines]


def group_page(
    v: Viewer, run_name: str, group: int, diff: tuple[str, str] | None = None
) -> dict[str, object]:
    """The samples of one group side by side; with ``diff``, a diff of two of their conversations."""
    run = v.store.runs.get(run_name)
    members = queries.group_members(v.store, run, group)
    if not members:
        raise UnknownRunError(f"run {run.name!r} has no group {group}")
    conversations = {m.session.id: conversation_text(v, m.session) for m in members}
    diff_lines: list[str] | None = None
    if diff is not None:
        missing = [sid for sid in diff if sid not in conversations]
        if missing:
            raise RequestError(f"session {missing[0]!r} is not in group {group}", param="a")
        a, b = diff
        diff_lines = list(
            difflib.unified_diff(conversations[a], conversations[b], fromfile=a, tofile=b, lineterm="", n=2)
        )
    return {
        "run": run,
        "group": group,
        "members": members,
        "conversations": conversations,
        "diff": diff,
        "diff_lines": diff_lines,
    }


PLOTTED_METRICS = (
    "loss",
    "grad_norm",
    "entropy",
    "kl_behaviour",
    "is_ratio_mean",
    "is_truncated_share",
    "reward_mean",
    "reward_std",
    "response_length_mean",
    "staleness_mean",
    "trained_tokens",
    "tokens_per_s",
)
"""The step metrics the training page plots against the step (docs/training.md)."""


def training_page(v: Viewer, run_name: str) -> dict[str, object]:
    """Consumers of a run, their checkpoints, steps and step metrics (plotted against the step), and
    the reward per policy version of training and eval sessions."""
    run = v.store.runs.get(run_name)
    out = []
    plots: dict[str, dict[str, list[list[float]]]] = {}
    for consumer in queries.consumers(v.store, run):
        steps = queries.steps(v.store, run, consumer)
        metrics = v.store.consumers.metrics(run, consumer)
        for name in PLOTTED_METRICS:
            points = [[step, m[name]] for step, m in sorted(metrics.items()) if name in m]
            if points:
                plots.setdefault(name, {})[consumer] = points
        out.append(
            {
                "name": consumer,
                "checkpoint": v.store.consumers.checkpoint(run, consumer),
                "steps": steps,
                "metrics": metrics,
            }
        )
    return {"run": run, "consumers": out, "plots": plots, "rewards": _reward_curves(v, run)}


def _reward_curves(v: Viewer, run: Run, label: str = "") -> dict[str, list[list[float]]]:
    """``{"<label>training": [[version, mean, n]...], "<label>eval": ...}`` (empty series left out)."""
    curves = {
        f"{label}training": [[p.x, p.mean_reward, p.n] for p in queries.reward_by_version(v.store, run)],
        f"{label}eval": [[p.x, p.mean_reward, p.n] for p in queries.eval_by_version(v.store, run)],
    }
    return {k: pts for k, pts in curves.items() if pts}


def compare_page(v: Viewer, run_names: list[str]) -> dict[str, object]:
    """Chosen runs' training and eval reward per policy version, and reward per step, overlaid."""
    names = list(dict.fromkeys(n.strip() for n in run_names if n.strip()))
    if not names:
        raise RequestError("choose runs to compare: /compare?runs=a,b", param="runs")
    runs = [v.store.runs.get(n) for n in names]
    by_version: dict[str, list[list[float]]] = {}
    by_step: dict[str, list[list[float]]] = {}
    for run in runs:
        by_version.update(_reward_curves(v, run, f"{run.name} "))
        for consumer in queries.consumers(v.store, run):
            points = [
                [step, m["reward_mean"]]
                for step, m in sorted(v.store.consumers.metrics(run, consumer).items())
                if "reward_mean" in m
            ]
            if points:
                by_step[f"{run.name} {consumer}"] = points
    return {
        "runs": runs,
        "all_runs": [r.name for r in v.store.runs.list()],
        "curves": {"by_version": by_version, "by_step": by_step},
    }


def step_page(v: Viewer, run_name: str, consumer: str, step: int) -> dict[str, object]:
    """One step's manifest: sessions, segments, token counts per policy version, batch hash."""
    run = v.store.runs.get(run_name)
    found = [s for s in queries.steps(v.store, run, consumer) if s.step == step]
    if not found:
        raise RequestError(f"consumer {consumer!r} of run {run.name!r} has no step {step}", param="step")
    s = found[0]
    versions: dict[str, int] = {}
    for sample in s.manifest.get("samples", []):
        for ver, n in (sample.get("versions") or {}).items():
            versions[ver] = versions.get(ver, 0) + int(n)
    return {
        "run": run,
        "consumer": consumer,
        "step": s,
        "samples": s.manifest.get("samples", []),
        "groups": s.manifest.get("groups", []),
        "versions": dict(sorted(versions.items(), key=lambda kv: int(kv[0]))),
        "manifest": v.redact(_pretty({k: val for k, val in s.manifest.items() if k != "samples"})),
    }


PAGE_DIFF_BYTES = 4 * 1024 * 1024
"""The file bytes one session page's diffs read in all (each turn within :class:`DiffCaps`)."""


def _diff_class(line: str) -> str:
    if line.startswith(("+++", "---")):
        return "file"
    if line.startswith("@@"):
        return "hunk"
    return {"+": "add", "-": "del"}.get(line[:1], "")


def workspace_files(v: Viewer, session_id: str) -> list[dict[str, object]]:
    """Per checkpoint turn, the paths it changed with text diffs (redacted; the template escapes
    them: file contents are the agent's); past :data:`PAGE_DIFF_BYTES`, names only."""
    out: list[dict[str, object]] = []
    used = 0
    for plain in session_changes(v.store, session_id):
        left = PAGE_DIFF_BYTES - used
        caps = DiffCaps(max_total_bytes=min(left, DiffCaps().max_total_bytes))
        turn = turn_diffs(v.store, session_id, plain.turn_index, caps) if left > 0 else None
        shown = turn or plain
        used += shown.read_bytes
        files = [
            {
                "path": v.redact(f.path),
                "change": f.change,
                "kind": f.kind,
                "note": v.redact(f.note) if shown is turn else "diff left out: the page's diffs are full",
                "diff": [(_diff_class(x), v.redact(x)) for x in f.diff or []],
            }
            for f in shown.files
        ]
        out.append({"turn": plain.turn_index, "counts": plain.counts(), "files": files})
    return out
