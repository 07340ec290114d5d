"""Live updates over server-sent events while a page is open, and the static bundle from disk."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from dressage.cli import app
from dressage.config import Settings
from dressage.store import EventStore
from dressage.store.db import upgrade
from dressage.view.app import create_app
from dressage.view.readonly import open_readonly_store
from tests.view.browser import css, draw_tokens, one, severe_console_errors, text, url, wait
from tests.view.builders import append_live_turn
from tests.view.conftest import ViewedLog, serve

# The first test of each backend builds the log: a real rollout (and, once per session, the dev
# engine shared with tests/rollout), which on a busy two-core machine can take minutes.
pytestmark = pytest.mark.timeout(900)


def test_open_session_and_run_pages_update_as_turns_land(viewed: ViewedLog, browser) -> None:
    run = viewed.multi.run
    session = viewed.store.sessions.open(run, session_id=f"live-{viewed.backend}", agent="coder")
    append_live_turn(viewed.store, run, session.id, 0, "first answer")
    browser.get(url(viewed.base, "/session", id=session.id))
    wait(browser, lambda d: "on" in (one(d, "#live-dot").get_attribute("class") or ""))
    browser.execute_script("window.notReloaded = true")
    assert one(browser, "#session-body").get_attribute("data-turns") == "1"
    append_live_turn(viewed.store, run, session.id, 1, "second answer arrives live")
    wait(browser, lambda d: one(d, "#session-body").get_attribute("data-turns") == "2")
    assert "second answer arrives live" in text(one(browser, "#turn-1 .msg.role-assistant"))
    draw_tokens(browser)
    assert "second answer arrives live" in text(one(browser, "#tokens"))  # the token view was redrawn
    viewed.store.sessions.finalize(session.id, "finished", reward=1.0, finish_reason="stop")
    wait(browser, lambda d: text(one(d, "#status")) == "finished")
    assert browser.execute_script("return window.notReloaded === true")
    # the run page's counts follow the log too
    browser.get(url(viewed.base, "/run", name=run))
    wait(browser, lambda d: "on" in (one(d, "#live-dot").get_attribute("class") or ""))
    browser.execute_script("window.notReloaded = true")
    before = int(text(one(browser, "#n-turns")))
    other = viewed.store.sessions.open(run, session_id=f"live2-{viewed.backend}")
    append_live_turn(viewed.store, run, other.id, 0, "another")
    wait(browser, lambda d: int(text(one(d, "#n-turns"))) == before + 1)
    wait(browser, lambda d: text(one(d, "#n-running")) == "1")  # (the summary may be swapped again meanwhile)
    assert browser.execute_script("return window.notReloaded === true")
    viewed.store.sessions.finalize(other.id, "failed", finish_reason="agent_crashed")
    assert not severe_console_errors(browser)


def test_stopping_the_viewer_ends_its_open_event_streams(viewed: ViewedLog) -> None:
    """A page left open holds an endless event stream; stopping the viewer must end it (not wait
    for the browser to leave while the stream goes on polling the log)."""
    store = open_readonly_store(Settings(database_url=viewed.url, home=viewed.home))
    server = serve(create_app(store))
    server.start()
    try:
        live = url(server.base, "/live", run=viewed.quick, after=0)
        with httpx.stream("GET", live, timeout=httpx.Timeout(30, read=20)) as r:
            lines = r.iter_lines()
            assert next(x for x in lines if x.startswith("id: "))  # the stream is open and sending
            assert server.stop()  # the server thread ended with the stream open
            list(lines)  # the response ended (a stream left open would raise ReadTimeout here)
    finally:
        server.stop()
        store.close()


def test_a_stream_whose_log_cannot_be_read_ends_and_the_viewer_stays_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A read error in the event stream ends that stream (the browser reconnects and resumes from
    its last position) instead of breaking the response with a traceback."""
    url_ = f"sqlite:///{tmp_path / 'log.db'}"
    upgrade(url_)
    settings = Settings(database_url=url_, home=tmp_path)
    writer = EventStore.open(settings=settings)
    writer.runs.create("r")
    writer.close()
    store = open_readonly_store(settings)
    server = serve(create_app(store))
    server.start()
    try:
        with httpx.stream("GET", url(server.base, "/live", run="r", after=0), timeout=20) as r:
            lines = r.iter_lines()
            assert next(x for x in lines if x.startswith("id: "))  # the run's first event
            (tmp_path / "log.db").unlink()
            store.db.engine.dispose()  # the next read opens a new connection: no database file
            list(lines)  # the stream ended (a stream left open would raise ReadTimeout here)
        assert "live stream of run 'r' ended: database read failed" in caplog.text
        page = httpx.get(url(server.base, "/"))  # the viewer still answers, and says why
        assert page.status_code == 503 and "The log could not be read" in page.text
    finally:
        assert server.stop()
        store.close()


def test_bundle_opens_from_disk_without_a_server(viewed: ViewedLog, browser, tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    result = CliRunner().invoke(
        app,
        ["view", "bundle", viewed.quick, "--out", str(out), "--database-url", viewed.url],
        env={"DRESSAGE_HOME": str(viewed.home), "COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    browser.get((out / "index.html").as_uri())
    rows = wait(browser, lambda d: css(d, "#sessions tbody tr"))
    assert len(rows) == 6
    wait(browser, lambda d: css(d, "#chart-version canvas"))
    finished = viewed.store.sessions.list(viewed.quick, status="finished")[0]
    next(r for r in rows if r.get_attribute("data-session") == finished.id).find_element(
        "css selector", "td a"
    ).click()
    assert draw_tokens(browser)
    assert text(one(browser, "#session-id")) == finished.id
    assert css(browser, ".msg.role-assistant")
    # the artifacts were copied next to the pages, byte for byte
    refs = {a.name: a for a in viewed.store.artifacts.list(viewed.quick, session_id=finished.id)}
    links = {
        text(a.find_element("xpath", "../../td[1]")): a.get_attribute("href")
        for a in css(browser, "#artifacts td:last-child a:first-child")
    }
    assert set(links) == set(refs)
    for name, href in links.items():
        assert Path(href.removeprefix("file://")).read_bytes() == viewed.store.artifacts.get(refs[name])
    # refusing to overwrite
    again = CliRunner().invoke(
        app,
        ["view", "bundle", viewed.quick, "--out", str(out), "--database-url", viewed.url],
        env={"DRESSAGE_HOME": str(viewed.home)},
    )
    assert again.exit_code == 1 and "not empty" in again.output
