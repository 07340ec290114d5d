"""The SQL surface: per-token and per-trajectory views, one definition per backend.

``token_events`` gives one row per token (``position`` counts from 0 within its segment;
``logprob`` is NULL for tokens the policy did not generate). ``trajectories`` gives one row per
session with its turn, segment and token counts, and since migration 0004 its task's ``kind``
(``train``, or ``eval`` for evaluation sessions, which are never trained) and ``eval_version`` (the
policy version an eval session evaluates). Migrations create the views; a migration that changes
one names the revision whose definition it installs (:func:`create_view_statements`), so older
migrations keep creating exactly what they created.
"""

from __future__ import annotations

POSTGRES_TOKEN_EVENTS = """
CREATE VIEW token_events AS
SELECT r.name AS run_name, t.session_id, t.segment_index, t.turn_index,
       t.segment_offset + u.ord - 1 AS position, u.token_id, u.logprob, u.loss_mask, u.policy_version
FROM turns t
JOIN runs r ON r.id = t.run_id
CROSS JOIN LATERAL (
    SELECT c.tok AS token_id, CAST(NULL AS real) AS logprob, false AS loss_mask,
           CAST(NULL AS integer) AS policy_version, c.ord AS ord
    FROM unnest(t.context_ids) WITH ORDINALITY AS c(tok, ord)
    UNION ALL
    SELECT g.tok, g.lp, g.m, g.v, t.n_context + g.ord
    FROM unnest(t.generated_ids, t.logprobs, t.loss_mask, t.policy_versions)
         WITH ORDINALITY AS g(tok, lp, m, v, ord)
) u
"""

SQLITE_TOKEN_EVENTS = """
CREATE VIEW token_events AS
SELECT r.name AS run_name, t.session_id, t.segment_index, t.turn_index,
       t.segment_offset + c.key AS position, c.value AS token_id, NULL AS logprob,
       0 AS loss_mask, NULL AS policy_version
FROM turns t JOIN runs r ON r.id = t.run_id, json_each(t.context_ids) c
UNION ALL
SELECT r.name, t.session_id, t.segment_index, t.turn_index,
       t.segment_offset + t.n_context + g.key, g.value,
       json_extract(t.logprobs, '$[' || g.key || ']'),
       json_extract(t.loss_mask, '$[' || g.key || ']'),
       json_extract(t.policy_versions, '$[' || g.key || ']')
FROM turns t JOIN runs r ON r.id = t.run_id, json_each(t.generated_ids) g
"""


_TRAINED_0001 = "COALESCE(SUM(t.n_trained), 0)"
_TRAINED_0009 = "CASE WHEN k.kind = 'eval' THEN 0 ELSE COALESCE(SUM(t.n_trained), 0) END"


def _trajectories_view(task_columns: tuple[str, ...] = (), trained: str = _TRAINED_0001) -> str:
    """``trajectories``: one row per session with its task's place (index, group, sample), its attempt,
    status and reward, the ``task_columns`` of its task after those, and its turn, segment and token
    counts (``trained``: the expression of ``n_trained_tokens``).

    Every revision's definition comes from here: with no ``task_columns`` the text is exactly the one
    revision 0001 installed, so a later revision adds its columns through ``task_columns`` (or a new
    argument) and leaves that text as it is."""
    extra = "".join(f" {c}," for c in task_columns)
    extra_group = f",\n         {', '.join(task_columns)}" if task_columns else ""
    return f"""
CREATE VIEW trajectories AS
SELECT r.name AS run_name, s.id AS session_id, k.task_index, k.group_index, k.sample_index,
       s.attempt, s.status, s.reward,{extra}
       COUNT(t.id) AS n_turns,
       COUNT(DISTINCT t.segment_index) AS n_segments,
       COALESCE(SUM(t.n_context + t.n_generated), 0) AS n_tokens,
       {trained} AS n_trained_tokens
FROM sessions s
JOIN runs r ON r.id = s.run_id
LEFT JOIN tasks k ON k.id = s.task_id
LEFT JOIN turns t ON t.session_id = s.id
GROUP BY r.name, s.id, k.task_index, k.group_index, k.sample_index, s.attempt, s.status, s.reward{extra_group}
"""


TRAJECTORIES_0001 = _trajectories_view()
"""``trajectories`` as revision 0001 created it."""

TRAJECTORIES_0004 = _trajectories_view(("k.kind", "k.eval_version"))
"""``trajectories`` as revision 0004 created it: the task's ``kind`` and ``eval_version`` too."""

TRAJECTORIES = _trajectories_view(("k.kind", "k.eval_version"), _TRAINED_0009)
"""``trajectories`` since revision 0009: an eval session's ``n_trained_tokens`` is 0 (eval sessions
are never trained, whatever loss mask their turns recorded)."""

TORCH_STEP_METRICS = (
    "loss",
    "pg_loss",
    "entropy",
    "kl_behaviour",
    "grad_norm",
    "lr",
    "clip_fraction",
    "is_ratio_mean",
    "is_ratio_max",
    "is_truncated_share",
)
"""What the torch backend measures in each step."""

BATCH_STEP_METRICS = (
    "trained_tokens",
    "samples",
    "trajectories",
    "response_length_mean",
    "response_length_max",
    "reward_mean",
    "reward_std",
    "staleness_mean",
    "staleness_max",
)
"""The batch metrics every step records (plus ``staleness_tokens_<k>``, one per staleness seen)."""

TIMING_STEP_METRICS = ("step_time_s", "tokens_per_s")
"""How long a step took and its throughput."""

REFERENCE_STEP_METRICS = ("kl_reference", "kl_loss")
"""What the torch backend measures with a reference model (``train.reference``; columns since 0008)."""

STEP_METRIC_COLUMNS = (
    *TORCH_STEP_METRICS,
    *BATCH_STEP_METRICS,
    *TIMING_STEP_METRICS,
    *REFERENCE_STEP_METRICS,
)
"""The metrics the ``step_metrics`` view shows as columns (revision 0006; the reference's since 0008);
any other name (the staleness distribution ``staleness_tokens_<k>``, a backend's extras) is in
``train_step_metrics``."""


def step_metrics_view() -> str:
    """``step_metrics``: one row per committed step with its metrics as columns (NULL when absent)."""
    columns = ",\n       ".join(
        f"MAX(CASE WHEN m.name = '{name}' THEN m.value END) AS {name}" for name in STEP_METRIC_COLUMNS
    )
    return f"""
CREATE VIEW step_metrics AS
SELECT r.name AS run_name, s.consumer, s.step, s.position, s.created_at,
       {columns}
FROM train_steps s
JOIN runs r ON r.id = s.run_id
LEFT JOIN train_step_metrics m ON m.run_id = s.run_id AND m.consumer = s.consumer AND m.step = s.step
GROUP BY r.name, s.consumer, s.step, s.position, s.created_at
"""


SESSION_TREE = """
CREATE VIEW session_tree AS
WITH RECURSIVE tree(session_id, root_session_id, depth) AS (
    SELECT s.id, s.id, 0 FROM sessions s
    WHERE s.parent_session_id IS NULL
       OR NOT EXISTS (SELECT 1 FROM sessions p WHERE p.id = s.parent_session_id)
    UNION ALL
    SELECT c.id, tree.root_session_id, tree.depth + 1
    FROM sessions c JOIN tree ON c.parent_session_id = tree.session_id
)
SELECT r.name AS run_name, s.id AS session_id, s.parent_session_id, s.fork_turn, tree.depth,
       tree.root_session_id,
       CASE WHEN s.fork_turn IS NULL THEN NULL ELSE (
           SELECT COALESCE(SUM(u.n_context + u.n_generated), 0) FROM turns u
           WHERE u.session_id = s.id AND u.turn_index < s.fork_turn
       ) END AS shared_tokens,
       s.status, s.reward
FROM tree
JOIN sessions s ON s.id = tree.session_id
JOIN runs r ON r.id = s.run_id
"""
"""``session_tree`` (revision 0007): each session's place in its fork tree: its parent and fork
turn (NULL for a root), its depth (0 for a root), its root, and the shared-prefix length in tokens
(``shared_tokens``: context + generated tokens of its turns before the fork turn, which are copies
of the parent's; NULL for a root). A session whose parent is no longer in the log (a fork into
another run outlives its parent's dropped run) is shown as a root (its columns keep the fork)."""

VIEW_NAMES = ("token_events", "trajectories")

_TRAJECTORIES_BY_REVISION = {"0001": TRAJECTORIES_0001, "0004": TRAJECTORIES_0004, "0009": TRAJECTORIES}
HEAD_REVISION = "0009"
"""The newest migration that changed a view."""


def create_view_statements(dialect: str, revision: str = HEAD_REVISION) -> list[str]:
    """The CREATE VIEW statements for ``dialect`` (``postgresql`` or ``sqlite``) as of ``revision``."""
    token_events = POSTGRES_TOKEN_EVENTS if dialect == "postgresql" else SQLITE_TOKEN_EVENTS
    return [token_events, _TRAJECTORIES_BY_REVISION[revision]]


def trajectories_view(revision: str = HEAD_REVISION) -> str:
    """The CREATE VIEW statement of ``trajectories`` as of ``revision`` (the same on both backends)."""
    return _TRAJECTORIES_BY_REVISION[revision]


def drop_view_statements() -> list[str]:
    """DROP VIEW statements for every view, in a safe order."""
    return [f"DROP VIEW IF EXISTS {name}" for name in VIEW_NAMES]


POSTGRES_TOKEN_DECISIONS = """
CREATE VIEW token_decisions AS
SELECT r.name AS run_name, d.consumer, d.step, d.sample, t.session_id, t.segment_index, t.turn_index,
       t.segment_offset + u.ord - 1 AS position, u.token_id, u.logprob, u.policy_version, d.advantage,
       u.weight AS importance_weight, c.code AS mask_code, c.reason AS mask_reason
FROM train_token_decisions d
JOIN runs r ON r.id = d.run_id
JOIN turns t ON t.session_id = d.session_id AND t.segment_index = d.segment_index
CROSS JOIN LATERAL (
    SELECT LEAST(GREATEST(d.response_start - t.segment_offset, 0), t.n_context + t.n_generated) AS pre,
           t.segment_offset - d.response_start AS shift, t.n_context + t.n_generated AS n
) k
CROSS JOIN LATERAL unnest(
    t.context_ids || t.generated_ids,
    array_fill(CAST(NULL AS real), ARRAY[t.n_context]) || t.logprobs,
    array_fill(CAST(NULL AS integer), ARRAY[t.n_context]) || t.policy_versions,
    array_fill(CAST(1 AS smallint), ARRAY[k.pre]) || d.mask_reasons[k.shift + k.pre + 1 : k.shift + k.n],
    array_fill(CAST(NULL AS real), ARRAY[k.pre]) || d.importance_weights[k.shift + k.pre + 1 : k.shift + k.n]
) WITH ORDINALITY AS u(token_id, logprob, policy_version, code, weight, ord)
JOIN mask_reasons c ON c.code = u.code
"""
"""On PostgreSQL the view walks each turn of a trained segment once, its token arrays and the slice
of the decision arrays that covers it side by side (``token_events``' columns, computed the way
``token_events`` computes them), so reading a session costs what reading its tokens costs."""

SQLITE_TOKEN_DECISIONS = """
CREATE VIEW token_decisions AS
SELECT r.name AS run_name, d.consumer, d.step, d.sample, e.session_id, e.segment_index, e.turn_index,
       e.position, e.token_id, e.logprob, e.policy_version, d.advantage,
       CASE WHEN e.position >= d.response_start
            THEN json_extract(d.importance_weights, '$[' || (e.position - d.response_start) || ']') END
           AS importance_weight,
       c.code AS mask_code, c.reason AS mask_reason
FROM token_events e
JOIN train_token_decisions d ON d.session_id = e.session_id AND d.segment_index = e.segment_index
JOIN runs r ON r.id = d.run_id
JOIN mask_reasons c ON c.code = CASE WHEN e.position < d.response_start THEN 1
    ELSE json_extract(d.mask_reasons, '$[' || (e.position - d.response_start) || ']') END
"""
"""On SQLite each token of ``token_events`` picks its entries out of the decision arrays by index
(``json_extract``; SQLite keeps the parsed array between calls of one statement)."""


def token_decisions_view(dialect: str) -> str:
    """``token_decisions``: one row per token of every trained sample's segment, for each step that
    trained it: the token (``token_events``' columns), the sample's advantage, the token's importance
    weight (NULL before the response or when the backend computed none) and its mask reason
    (``mask_code``, ``mask_reason``: ``trained`` when it was trained; ``prompt`` before the response).
    It reads ``turns`` (PostgreSQL) or ``token_events`` (SQLite): a migration that changes those
    drops this view first and recreates it after."""
    return POSTGRES_TOKEN_DECISIONS if dialect == "postgresql" else SQLITE_TOKEN_DECISIONS


WORKSPACE_CHANGES = """
CREATE VIEW workspace_changes AS
SELECT r.name AS run_name, c.session_id, c.turn_index, c.path, c.change, c.kind, c.mode, c.size,
       c.sha256, k.manifest_sha256
FROM sandbox_checkpoint_changes c
JOIN sandbox_checkpoints k ON k.session_id = c.session_id AND k.turn_index = c.turn_index
JOIN runs r ON r.id = k.run_id
"""
"""``workspace_changes`` (revision 0010): one row per (session, turn, path) that the sandbox checkpoint
taken when request ``turn_index`` arrived adds, modifies or removes against the session's checkpoint
before it (a fork's first checkpoint: against its parent's at the fork turn). ``path`` is
``<root>/<relative path>`` (``workspace/src/a.py``); ``kind``, ``mode``, ``size`` and ``sha256`` are
the new entry's (NULL for ``removed``). A turn whose tree did not change has no row; a turn kept no
checkpoint of (retention, caps) has none either, and the next checkpoint's rows are against the last
one kept."""
