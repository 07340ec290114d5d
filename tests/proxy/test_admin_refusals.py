"""The admin API refuses a bad record with a 4xx naming the field, never with the database's text."""

from __future__ import annotations

from tests.proxy.conftest import Harness
from tests.proxy.test_admin_names import _post


def test_opening_a_session_of_an_unknown_task_is_a_400_naming_task_id(proxy_any: Harness) -> None:
    base = proxy_any.server.base_url
    run = proxy_any.run()
    answer = _post(base, "/admin/sessions", {"run": run, "agent": "a", "task_id": 987_654_321})
    error = answer.json()["error"]
    assert answer.status_code == 400 and error["param"] == "task_id" and error["code"] == "invalid_record"
    assert error["message"] == f"task_id 987654321 is not a task of run {run!r}"
    assert proxy_any.store.sessions.list(run) == []
