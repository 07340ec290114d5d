"""A trained tree in the viewer (issue 34, point 7), in headless Chromium: the tree page colours
every node by its session's reward (a forked session too, not grey) and its labels fit inside the
drawing; the group page lists every session of the tree (forks carry no task of their own) with the
advantage of each node it holds, as the trainer recorded them; a session's segment head lists those
per-node advantages and its tokens take their node's advantage when coloured by advantage."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from dressage.config import Settings
from dressage.store import EventStore
from dressage.view.app import create_app
from dressage.view.readonly import open_readonly_store
from dressage.view.tree import reward_fill
from tests.training.test_trees import EXPECTED_TURN_ADVANTAGES, TRAINED_TURNS
from tests.view.browser import css, draw_tokens, one, severe_console_errors, text, url, wait
from tests.view.builders import build_trained_tree
from tests.view.conftest import serve

RUN = "tree-with-a-rather-long-run-name-for-labels"
REWARDS = {"R": 1.0, "A": 0.0, "C": 1.0, "B": 0.5, "S": 0.0}


@dataclass
class TreeLog:
    base: str
    sessions: dict[str, str]  # R, A, C, B, S -> session id


@pytest.fixture(scope="module")
def tree_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TreeLog]:
    home = tmp_path_factory.mktemp("tree-pages")
    settings = Settings(database_url=f"sqlite:///{home / 'log.db'}", home=home)
    store = EventStore.open(settings=settings)
    ids = build_trained_tree(store, RUN)
    store.close()
    reader = open_readonly_store(settings)
    server = serve(create_app(reader))
    server.start()
    yield TreeLog(server.base, dict(zip("RACBS", ids, strict=True)))
    server.stop()
    reader.close()


def _assert_node_advantages(name: str, spans: list[tuple[int, int, float]]) -> None:
    """The spans ``(first, end, advantage)`` cover the session's turns, each with the advantage
    the trainer gave that turn's node (tests/training/test_trees.py computes them by hand)."""
    expected = EXPECTED_TURN_ADVANTAGES[name]
    covered = [t for first, end, _ in spans for t in range(first, end)]
    assert covered == list(range(len(expected))), (name, spans)
    for first, end, advantage in spans:
        assert all(expected[t] == pytest.approx(advantage) for t in range(first, end)), (name, spans)


def _spans(elements) -> list[tuple[int, int, float]]:  # type: ignore[no-untyped-def]
    return [
        (int(e.get_attribute("data-first-turn")), int(e.get_attribute("data-end-turn")),
         float(e.get_attribute("data-advantage")))
        for e in elements
    ]  # fmt: skip


def test_tree_page_colours_every_node_and_fits_its_labels(tree_log: TreeLog, browser) -> None:
    browser.get(url(tree_log.base, "/tree", session=tree_log.sessions["C"]))
    nodes = wait(browser, lambda d: css(d, "#tree a.tree-node"))
    by_session = {n.get_attribute("data-session"): n for n in nodes}
    assert set(by_session) == {tree_log.sessions[x] for x in "RACB"}
    for name in "RACB":  # R and A were forked: coloured by their reward too, never grey
        circle = one(by_session[tree_log.sessions[name]], "circle")
        assert circle.get_attribute("fill") == reward_fill(REWARDS[name]), name
    assert reward_fill(1.0) != reward_fill(None) and reward_fill(0.0) != reward_fill(None)
    width, right = browser.execute_script(
        "var svg = document.getElementById('tree');"
        "var ends = Array.from(svg.querySelectorAll('text.label')).map(function (t) {"
        "  var b = t.getBBox(); return b.x + b.width; });"
        "return [svg.viewBox.baseVal.width, Math.max.apply(null, ends)];"
    )
    assert right <= width, (right, width)
    assert not severe_console_errors(browser)


def test_group_page_lists_the_whole_tree_with_per_node_advantages(tree_log: TreeLog, browser) -> None:
    browser.get(url(tree_log.base, "/group", run=RUN, group=0))
    rows = wait(browser, lambda d: css(d, "#members tbody tr"))
    ids = {v: k for k, v in tree_log.sessions.items()}
    assert [ids[r.get_attribute("data-session")] for r in rows] == list("RACBS")
    assert [r.get_attribute("data-depth") for r in rows] == ["0", "1", "2", "1", "0"]
    for row in rows:
        name = ids[row.get_attribute("data-session")]
        assert float(text(one(row, ".reward"))) == REWARDS[name]
        spans = css(row, ".advantage .node")
        _assert_node_advantages(name, _spans(spans))
        trained_here = [
            t for s in spans if s.get_attribute("data-trained-in") == tree_log.sessions[name]
            for t in range(int(s.get_attribute("data-first-turn")), int(s.get_attribute("data-end-turn")))
        ]  # fmt: skip
        assert trained_here == TRAINED_TURNS[name], name
        assert "step 1" in text(css(row, "td")[5])
    assert len(css(browser, ".side-by-side .column")) == 5
    assert not severe_console_errors(browser)


def test_session_page_shows_per_node_advantages(tree_log: TreeLog, browser) -> None:
    browser.get(url(tree_log.base, "/session", id=tree_log.sessions["C"]))
    head = wait(browser, lambda d: css(d, ".seg-head .node-advantage"))
    _assert_node_advantages("C", _spans(head))
    assert "(trained in another session)" in text(head[0])  # R's turns 0-1, trained in R
    used = " ".join(text(one(browser, "#used-by")).split())
    assert "advantage per tree node: turns 0-1 0.125, turn 2 -0.125, turn 3 0.5" in used, used
    draw_tokens(browser)
    one(browser, "input[name=colour][value=advantage]").click()
    blocks = css(browser, "#tokens .turn-tokens")
    by_turn = {text(one(b, ".turn-mark")): b for b in blocks}
    own = css(by_turn["turn 3"], ".tok.gen")  # C's own node: advantage 0.5, the largest
    assert own and all("av4" in (t.get_attribute("class") or "") for t in own)
    assert not severe_console_errors(browser)
