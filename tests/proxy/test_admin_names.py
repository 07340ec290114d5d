"""The admin API's current names and the former ones it still accepts.

``info`` (the store's word) on finalize, with ``metadata`` as a deprecated alias; ``/admin/continue``
(continue generation after a weight update) with ``/admin/resume`` as its former name;
``/admin/sessions/{id}/take_over`` with ``.../resume`` as its former name.
"""

from __future__ import annotations

import httpx
import pytest

from dressage.errors import LeaseError
from dressage.rollout.proxy_ring import ProxyRing
from tests.proxy.conftest import ADMIN, Harness

AUTH = {"Authorization": f"Bearer {ADMIN}"}


def _post(base: str, path: str, body: dict[str, object]) -> httpx.Response:
    return httpx.post(f"{base}{path}", json=body, headers=AUTH, timeout=30)


def _open(base: str, run: str) -> str:
    out = _post(base, "/admin/sessions", {"run": run, "agent": "a"}).json()
    return str(out["session_id"])


def test_finalize_takes_info_and_its_deprecated_alias_metadata(proxy: Harness) -> None:
    base = proxy.server.base_url
    run = proxy.run()
    for field in ("info", "metadata"):
        sid = _open(base, run)
        got = _post(base, f"/admin/sessions/{sid}/finalize", {"status": "finished", field: {"k": field}})
        assert got.status_code == 200 and got.json()["status"] == "finished"
        assert proxy.store.sessions.get(sid).info["k"] == field
    sid = _open(base, run)
    both = _post(base, f"/admin/sessions/{sid}/finalize", {"status": "finished", "info": {}, "metadata": {}})
    assert both.status_code == 400 and both.json()["error"]["param"] == "metadata"


def test_continue_and_its_former_name_resume(proxy: Harness) -> None:
    base = proxy.server.base_url
    for path, version in (("/admin/continue", 4), ("/admin/resume", 5)):
        assert _post(base, "/admin/pause", {}).json() == {"paused": True}
        assert _post(base, path, {"version": version}).json() == {"paused": False, "version": version}
        assert proxy.server.coordinator.version == version
    proxy.loop.call(proxy.server.continue_generation(0))


def test_take_over_and_its_former_name_resume(proxy: Harness) -> None:
    base = proxy.server.base_url
    run = proxy.run()
    sid = _open(base, run)
    first = _post(base, f"/admin/sessions/{sid}/take_over", {"attempt": 2})
    assert first.status_code == 200 and first.json()["session_id"] == sid
    second = _post(base, f"/admin/sessions/{sid}/resume", {"attempt": 3})
    assert second.status_code == 200 and second.json()["token"] != first.json()["token"]
    assert proxy.store.sessions.get(sid).attempt == 3


def test_the_ring_refuses_finalizing_a_taken_over_attempt_as_in_process(proxy: Harness) -> None:
    """A stale attempt's finalize through the ring raises LeaseError (the episode's signal), not a
    generic error, and leaves the session open for the attempt that took it over."""
    base = proxy.server.base_url
    sid = _open(base, proxy.run())
    assert _post(base, f"/admin/sessions/{sid}/take_over", {"attempt": 2}).status_code == 200
    ring = ProxyRing([base], ADMIN, proxy.store)
    with pytest.raises(LeaseError, match="attempt"):
        proxy.loop.call(ring.finalize_session(sid, "finished", reward=1.0, attempt=1))
    assert proxy.store.sessions.get(sid).status == "running"
    done = proxy.loop.call(ring.finalize_session(sid, "finished", reward=1.0, attempt=2))
    assert done.status == "finished" and done.reward == 1.0
