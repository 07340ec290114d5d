"""A takeover records where the new attempt runs (a Ray worker's node), through the admin API too.

Sessions taken over after a Ray node was removed recorded no node of the attempt that took them
over: the takeover carried nothing but the attempt number, so the session's info still named the
removed node (or, once finalized without it, none) until the new attempt's finalize, and a finalize
replaces the info. Now the taker's info joins the session's info at once and its resume record
(kept through a finalize), and the ``session_resumed`` event says it.
"""

from __future__ import annotations

from dressage.rollout.proxy_ring import ProxyRing
from tests.proxy.conftest import ADMIN, Harness

FIRST = {"ray_node_id": "node-a", "ray_node_ip": "10.0.0.1", "worker": "ray-a"}
TAKER = {"ray_node_id": "node-b", "ray_node_ip": "10.0.0.2", "worker": "ray-b"}


def test_a_takeover_through_the_ring_records_the_new_attempts_node(proxy: Harness) -> None:
    ring = ProxyRing([proxy.server.base_url], ADMIN, proxy.store)
    run = proxy.run()
    sid = proxy.loop.call(ring.open_session(run, agent="a", info=FIRST)).session_id
    proxy.loop.call(ring.take_over_session(sid, attempt=2, info=TAKER))
    taken = proxy.store.sessions.get(sid)
    assert {k: taken.info[k] for k in TAKER} == TAKER and taken.info["resume"]["info"] == TAKER
    [resumed] = [e for e in proxy.store.events.read(run) if e.kind == "session_resumed"]
    assert resumed.payload["info"] == TAKER and resumed.payload["attempt"] == 2

    proxy.loop.call(ring.finalize_session(sid, "finished", reward=1.0, info={"turns": 0}, attempt=2))
    done = proxy.store.sessions.get(sid)
    assert done.status == "finished" and done.info["resume"]["info"]["ray_node_id"] == "node-b"


def test_an_in_process_takeover_records_it_the_same_way(proxy: Harness) -> None:
    run = proxy.run()
    sid = proxy.loop.call(proxy.server.open_session(run, agent="a", info=FIRST)).session_id
    proxy.loop.call(proxy.server.take_over_session(sid, attempt=2, info=TAKER))
    assert proxy.store.sessions.get(sid).info["ray_node_id"] == "node-b"
    proxy.loop.call(proxy.server.take_over_session(sid, attempt=3))  # no info: the last one stays
    info = proxy.store.sessions.get(sid).info
    assert info["ray_node_id"] == "node-b" and "info" not in info["resume"] and info["resume"]["count"] == 2
