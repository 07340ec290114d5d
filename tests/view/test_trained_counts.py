"""Eval sessions' tokens are never counted as trained in the viewer (issue 34, point 8): the run's
trained share and the sessions table's trained column leave them out, sorted or not, on both
backends (the sessions are recorded through the store, their turns with loss mask 1)."""

from __future__ import annotations

from dressage.store import EventStore
from dressage.view.decode import TokenDecoder
from dressage.view.listing import SessionQuery, list_sessions
from dressage.view.queries import run_overview
from tests.view.builders import build_eval_run


def test_eval_sessions_train_no_token_in_the_viewer(store: EventStore, run_name: str) -> None:
    ev = build_eval_run(store, run_name)  # 2 training + 3 eval sessions of 3 tokens, 1 generated
    overview = run_overview(store, store.runs.get(run_name))
    assert (overview.summary.tokens, overview.summary.trained_tokens) == (15, 2)
    assert overview.trained_share == 2 / 15
    for sort in ("created", "trained"):
        page = list_sessions(store, run_name, SessionQuery(sort=sort, descending=True), TokenDecoder(None))
        trained = {row["session"]: row["trained"] for row in page.rows}
        assert trained == {**{s: 1 for s in ev.train}, **{s: 0 for s in ev.evals}}
        if sort == "trained":
            assert {row["session"] for row in page.rows[:2]} == set(ev.train)
