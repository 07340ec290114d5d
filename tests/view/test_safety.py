"""Hostile content renders inert, secrets stay redacted, the viewer's access is read-only, and a
viewer beyond loopback asks for its token."""

from __future__ import annotations

import httpx
import pytest
from selenium.common.exceptions import NoAlertPresentException
from sqlalchemy import text as sql_text

from dressage.config import Settings
from dressage.errors import StoreError
from dressage.view.app import create_app
from dressage.view.readonly import open_readonly_store, reading
from tests.view.browser import css, draw_tokens, one, severe_console_errors, text, url, wait
from tests.view.builders import HOSTILE, SECRET
from tests.view.conftest import ViewedLog, serve

# The first test of each backend builds the log: a real rollout (and, once per session, the dev
# engine shared with tests/rollout), which on a busy two-core machine can take minutes.
pytestmark = pytest.mark.timeout(900)


def _assert_inert(browser) -> None:
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018  (an alert would mean a script ran)
    scripts = browser.execute_script(
        "return Array.from(document.scripts).map(s => [s.getAttribute('src'), s.type])"
    )
    assert all((src or "").startswith("/static/") for src, _ in scripts)
    assert not css(browser, "a[href^='javascript:'], textarea, iframe, object, embed")
    assert browser.execute_script("return window.pwned === undefined")


def test_hostile_text_in_tokens_tool_output_and_names_renders_inert(viewed: ViewedLog, browser) -> None:
    m = viewed.multi
    browser.get(url(viewed.base, "/session", id=m.session_id))
    draw_tokens(browser)
    _assert_inert(browser)
    assert len(css(browser, "script")) == 3  # htmx, its SSE extension, view.js: nothing from the log
    tool = text(css(browser, "#turn-1 .msg.role-tool pre")[0])
    assert HOSTILE in tool  # shown as text, character for character
    reply = text(one(browser, "#turn-1 .msg.role-assistant pre.content"))
    assert HOSTILE in reply
    assert HOSTILE in text(one(browser, "#tokens"))  # the token view too (textContent only)
    assert text(one(browser, "#artifacts td.filename")) == "<script>agent.log"
    # secrets: redacted in the conversation, the token view and everywhere in the page
    assert SECRET not in browser.page_source
    assert "api_key=[REDACTED]" in tool
    assert "[REDACTED]" in text(one(browser, "#tokens"))
    # the artifact opens as plain text in a sandbox
    one(browser, "#artifacts a").click()
    wait(browser, lambda d: "agent log" in d.page_source)
    _assert_inert(browser)
    # the run's config (holding the hostile note) on the run page
    browser.get(url(viewed.base, "/run", name=m.run))
    wait(browser, lambda d: css(d, "#sessions tbody tr"))
    _assert_inert(browser)
    assert not severe_console_errors(browser)


def test_bad_input_is_a_clear_4xx(viewed: ViewedLog) -> None:
    r = httpx.get(url(viewed.base, "/run", name=viewed.quick, sort="bogus"))
    assert r.status_code == 400 and "sort must be one of" in r.text
    r = httpx.get(url(viewed.base, "/run", name=viewed.quick, page="x"))
    assert r.status_code == 400 and "page must be a number" in r.text
    r = httpx.get(url(viewed.base, "/session", id="no-such-session"))
    assert r.status_code == 404 and "no session" in r.text
    r = httpx.get(url(viewed.base, "/run", name="no-such-run"))
    assert r.status_code == 404 and "no run named" in r.text
    r = httpx.get(url(viewed.base, "/"))
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert r.headers["x-content-type-options"] == "nosniff"


def test_viewer_connections_refuse_writes(viewed: ViewedLog) -> None:
    store = open_readonly_store(Settings(database_url=viewed.url, home=viewed.home))
    try:
        with pytest.raises(StoreError, match="read"), reading(store) as conn:
            conn.execute(sql_text("DELETE FROM sessions"))
        with pytest.raises(StoreError), reading(store) as conn:
            conn.execute(sql_text("CREATE TABLE sneaky (x int)"))
        assert len(viewed.store.sessions.list(viewed.quick)) == 6
    finally:
        store.close()


def test_a_token_is_required_when_set(viewed: ViewedLog) -> None:
    store = open_readonly_store(Settings(database_url=viewed.url, home=viewed.home))
    token = "t0ken-of-the-viewer-123456"
    server = serve(create_app(store, token=token))
    server.start()
    try:
        assert httpx.get(url(server.base, "/")).status_code == 401
        assert httpx.get(url(server.base, "/", token="wrong-token-xxxxxxxx")).status_code == 401
        with httpx.Client(base_url=server.base) as client:
            r = client.get(url("", "/run", name=viewed.quick, token=token))
            assert r.status_code == 303 and "token" not in r.headers["location"]
            assert client.get(r.headers["location"]).status_code == 200  # the cookie carries it
        ok = httpx.get(url(server.base, "/"), headers={"Authorization": f"Bearer {token}"})
        assert ok.status_code == 200
    finally:
        server.stop()
        store.close()
