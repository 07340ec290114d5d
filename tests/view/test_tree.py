"""The viewer's fork tree page and the session page's fork links, in headless Chromium.

A fork tree (a root, two forks of it at turn 2, a fork of a fork at turn 3) is written to each
backend's log; ``/tree`` of any of its sessions draws the root's tree: one node per session with
its depth, an edge per fork, leaves coloured by reward; the session page links parent and children.
"""

from __future__ import annotations

import uuid

from dressage.view.tree import reward_fill
from tests.view.browser import css, one, severe_console_errors, text, url, wait
from tests.view.builders import build_fork_tree
from tests.view.conftest import ViewedLog


def test_tree_page_draws_the_roots_tree(viewed: ViewedLog, browser) -> None:
    tree = build_fork_tree(viewed.store, f"tree-{viewed.backend}-{uuid.uuid4().hex[:6]}")
    browser.get(url(viewed.base, "/tree", session=tree.aa))  # any session of the tree shows its root's
    nodes = wait(browser, lambda d: css(d, "#tree a.tree-node"))
    assert text(one(browser, "#tree-root")) == tree.root
    got = {n.get_attribute("data-session"): n for n in nodes}
    assert list(got) == [tree.root, tree.a, tree.aa, tree.b]  # depth first, parents before children
    depth = {sid: int(n.get_attribute("data-depth") or -1) for sid, n in got.items()}
    assert depth == {tree.root: 0, tree.a: 1, tree.aa: 2, tree.b: 1}
    leaves = {sid for sid, n in got.items() if n.get_attribute("data-leaf") == "true"}
    assert leaves == {tree.aa, tree.b}
    for sid in leaves:  # leaves carry their reward's colour
        assert one(got[sid], "circle").get_attribute("fill") == reward_fill(tree.rewards[sid])
    assert reward_fill(1.0) != reward_fill(0.0)
    assert len(css(browser, "#tree path.tree-edge")) == 3
    rows = [[text(c) for c in css(r, "td")] for r in css(browser, "#tree-table tbody tr")]
    assert [(r[0], r[2], r[3], r[4]) for r in rows] == [
        (tree.root, "", "0", "4"), (tree.a, "2", "1", "3"), (tree.aa, "3", "2", "4"), (tree.b, "2", "1", "4"),
    ]  # fmt: skip
    assert not severe_console_errors(browser)

    got[tree.a].click()  # a node opens its session, which links its parent and its children
    wait(browser, lambda d: css(d, "#fork-links"))
    assert text(one(browser, "#session-id")) == tree.a
    assert text(one(browser, "#fork-parent")) == tree.root
    assert "Forked at turn 2" in text(one(browser, "#fork-links"))
    children = css(browser, "a.fork-child")
    assert [c.get_attribute("href").split("id=")[1] for c in children] == [tree.aa]
    children[0].click()
    wait(browser, lambda d: text(one(d, "#session-id")) == tree.aa)
    one(browser, "#fork-tree").click()
    wait(browser, lambda d: css(d, "#tree a.tree-node"))
    assert text(one(browser, "#tree-root")) == tree.root
    assert not severe_console_errors(browser)


def test_a_session_without_forks_has_no_fork_links(viewed: ViewedLog, browser) -> None:
    session = viewed.store.sessions.list(viewed.quick, status="finished")[0]
    browser.get(url(viewed.base, "/session", id=session.id))
    wait(browser, lambda d: css(d, "#session-id"))
    assert not css(browser, "#fork-links")
    browser.get(url(viewed.base, "/tree", session="no-such-session"))
    assert "no session" in text(one(browser, "main"))
