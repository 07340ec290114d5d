"""The session page's "Files" section (issue 38, "Seeing it"), in headless Chromium: per checkpoint
turn the paths it added, modified and removed, a text file's unified diff (opened from its summary),
a binary file and one over the cap described in words; file names and contents are the agent's and
stay text (no script of theirs runs, no element of theirs is made). The viewer reads the log through
its read-only store."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from dressage.config import Settings
from dressage.store import EventStore
from dressage.view.app import create_app
from dressage.view.readonly import open_readonly_store
from tests.view.browser import css, one, severe_console_errors, text, url, wait
from tests.view.conftest import serve
from tests.workspace_sessions import (
    BIG_BYTES,
    HOSTILE_NAME,
    HOSTILE_TEXT,
    SECRET,
    CheckpointedSession,
    build_checkpointed_session,
)


@dataclass
class FilesLog:
    base: str
    built: CheckpointedSession


@pytest.fixture(scope="module")
def files_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FilesLog]:
    home = tmp_path_factory.mktemp("files-pages")
    settings = Settings(database_url=f"sqlite:///{home / 'log.db'}", home=home)
    store = EventStore.open(settings=settings)
    built = build_checkpointed_session(store, "checkpointed", home / "trees")
    store.close()
    reader = open_readonly_store(settings)
    server = serve(create_app(reader))
    server.start()
    yield FilesLog(server.base, built)
    server.stop()
    reader.close()


def _changes(driver, turn: int) -> dict[str, str]:  # type: ignore[no-untyped-def]
    block = one(driver, f"#files-turn-{turn}")
    return {e.get_attribute("data-path"): e.get_attribute("data-change") for e in css(block, ".file-change")}


def test_session_page_shows_each_turns_files_and_diffs(files_log: FilesLog, browser) -> None:  # type: ignore[no-untyped-def]
    browser.get(url(files_log.base, "/session", id=files_log.built.session_id))
    blocks = wait(browser, lambda d: css(d, "#files .turn-files"))
    assert [b.get_attribute("data-turn") for b in blocks] == ["0", "1", "2", "3"]
    assert _changes(browser, 0) == {
        "workspace": "added",
        "workspace/src": "added",
        "workspace/src/app.py": "added",
        "workspace/notes.md": "added",
        "workspace/data.bin": "added",
    }
    assert _changes(browser, 1) == {
        "workspace/src/app.py": "modified",
        "workspace/notes.md": "removed",
        f"workspace/{HOSTILE_NAME}": "added",
        "workspace/big.txt": "added",
    }
    assert text(one(browser, "#files-turn-2 .empty")) == "no file changed"
    assert _changes(browser, 3) == {"workspace/data.bin": "modified"}

    app = one(browser, '#files-turn-1 .file-change[data-path="workspace/src/app.py"]')
    one(app, "details.file-diff summary").click()
    pre = wait(browser, lambda d: [p for p in css(app, "pre.diff") if p.is_displayed()])[0]
    assert [text(s) for s in css(pre, "span.del")] == ["-    print('version one')"]
    assert [text(s) for s in css(pre, "span.add")] == ["+    print('version two')"]
    assert pre.text.startswith("--- a/workspace/src/app.py\n+++ b/workspace/src/app.py\n@@")

    added = one(browser, "#files-turn-0 .file-change[data-path='workspace/src/app.py']")
    assert "+    print('version one')" in [text(s) for s in css(added, "pre.diff span.add")]

    hostile = one(browser, "#files-turn-1 .file-change[data-change='added'] code.path")
    paths = [text(e) for e in css(browser, "#files-turn-1 code.path")]
    assert f"workspace/{HOSTILE_NAME}" in paths and hostile.is_displayed()
    lines = [text(s) for s in css(browser, "#files-turn-1 pre.diff span.add")]
    assert all(f"+{x}" in lines for x in HOSTILE_TEXT.splitlines() if SECRET not in x)
    assert "+api_key=[REDACTED]" in lines and SECRET not in browser.page_source
    assert not css(browser, "#files script, #files img, #files b, #files i")
    assert browser.execute_script("return window.pwned === undefined")

    big = one(browser, "#files-turn-1 .file-change[data-path='workspace/big.txt'] .note")
    assert text(big) == f"{BIG_BYTES} bytes, over the 64 KiB a diff shows"
    binary = one(browser, "#files-turn-3 .file-change .note")
    assert text(binary) == "binary, 88 bytes"
    link = one(browser, "#turn-1 a.files-link")
    assert text(link) == "4 files changed" and link.get_attribute("href").endswith("#files-turn-1")
    assert not severe_console_errors(browser)


def test_fork_page_diffs_against_its_parents_checkpoint(files_log: FilesLog, browser) -> None:  # type: ignore[no-untyped-def]
    browser.get(url(files_log.base, "/session", id=files_log.built.fork_id))
    block = wait(browser, lambda d: css(d, "#files-turn-3"))[0]
    assert _changes(browser, 3) == {"workspace/src/app.py": "modified"}
    lines = [text(s) for s in css(block, "pre.diff span")]
    assert "-    print('version two')" in lines and "+    print('fork')" in lines
