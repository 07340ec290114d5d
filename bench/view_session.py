"""Viewer benchmark: how fast a big session page is served and becomes usable in the browser.

Builds, per backend, sessions of ``--turns`` turns and about ``--tokens`` tokens (real Qwen3.5 ids
of English text and tool-call markup, routed experts 8 layers x top-2) and a 1-turn session (the
baseline), serves the viewer on loopback (:class:`ViewServer`, as ``dressage-worker view`` does)
and measures, best and median:

* ``served`` (server): GET of the big session page until the last byte, warm (``--repeat``
  rounds); target < 300 ms. Baseline, same run: ``read_turns``, the store's read of the same
  session (the least any view of it must do); the ratio served / read_turns says what the page adds.
* in headless Chromium (when ``/usr/bin/chromium`` and ``chromedriver`` are installed), client-side
  from the page's own Performance timeline (navigation start = 0), after one warm-up page load:
  - ``usable``: until the page's ``view-ready`` mark, the first frame painted after its scripts
    ran (conversation, facts, diagram on screen; token view ready to draw); target < 1 s;
  - cold: a big session the server has not rendered yet, with the browser's cache emptied (so
    the static files are fetched too), ``--cold`` sessions; warm: the same page again
    (``--repeat`` rounds);
  - ``served (browser)``: request start to response end as the browser saw it;
  - baseline, same run and same browser: the 1-turn session's usable time (warm); the ratio big /
    small says what 100 turns and 30k tokens cost the browser over the least a session page costs;
  - ``tokens on scroll``: scrolling to the token view until its first turns are drawn and painted
    (the token view draws each turn's spans when it comes near the viewport), and ``draw all``:
    the "draw all" button until all ~30k spans are drawn and painted.

    python bench/view_session.py [--pg-url URL] [--backends sqlite,postgresql] [--turns 100]
        [--tokens 30000] [--repeat 7] [--cold 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.loopback

import httpx
import numpy as np
from bench_db import migrated_database
from rich.console import Console
from rich.table import Table

from dressage.config import Settings
from dressage.store import EventStore, NewTurn
from dressage.tito.tokenizer import load_qwen35_tokenizer
from dressage.view.app import create_app
from dressage.view.readonly import open_readonly_store
from dressage.view.server import ViewServer
from tests.loopback import ThreadedServer

console = Console(width=200)
TEXT = (
    "The function reads the configuration file, validates every field and returns a typed object. "
    "When a value is missing it raises an error that names the field and the file. "
)
CALL = "<tool_call>\n<function=run>\n<parameter=cmd>\npytest -q tests/test_config.py\n</parameter>\n</function>\n</tool_call>"


def build_session(store: EventStore, run: str, turns: int, tokens: int) -> str:
    """One session: a prompt, then ``turns`` turns of tool output + reply, ~``tokens`` in all."""
    tok = load_qwen35_tokenizer()
    store.runs.create(run)
    sid = f"bench-{uuid.uuid4().hex[:8]}"
    store.sessions.open(run, session_id=sid, agent="bench")
    rng = np.random.default_rng(0)
    body = tok.encode(TEXT * 200)
    per_turn = tokens // turns
    offset = 0
    for i in range(turns):
        ctx_text = (
            "<|im_start|>system\nYou are a coding agent.<|im_end|>\n<|im_start|>user\nFix it<|im_end|>\n<|im_start|>assistant\n"
            if i == 0
            else "\n<|im_start|>user\n<tool_response>\n"
        )
        ctx = tok.encode(ctx_text) + body[: per_turn // 3]
        if i:
            ctx += tok.encode("\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
        gen = body[: per_turn - len(ctx) - 40] + tok.encode(CALL + "<|im_end|>")
        rows = len(ctx) + len(gen) - (0 if offset else 1)
        store.turns.append(
            run,
            NewTurn(
                session_id=sid,
                turn_index=i,
                context_ids=ctx,
                generated_ids=gen,
                logprobs=(-rng.exponential(0.5, len(gen))).astype(np.float32),
                policy_versions=[i // 20] * len(gen),
                segment_offset=offset,
                routed_experts=rng.integers(0, 64, (rows, 8, 2), dtype=np.uint8),
                finish_reason="tool_calls",
                latency_ms=float(rng.uniform(50, 500)),
            ),
        )
        offset += len(ctx) + len(gen)
    store.sessions.finalize(sid, "finished", reward=1.0, finish_reason="stop")
    return sid


def timed(fn: object, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append(time.perf_counter() - t0)
    return out


READY = """
var done = arguments[arguments.length - 1];
(function poll() {
  var m = performance.getEntriesByName("view-ready");
  if (!m.length) return setTimeout(poll, 5);
  var n = performance.getEntriesByType("navigation")[0];
  done([m[0].startTime, n.responseEnd - n.requestStart]);
})();
"""
# Time from an action until its result is drawn and painted (two animation frames later).
SCROLL = """
var done = arguments[arguments.length - 1], t0 = performance.now();
document.getElementById("tokens").scrollIntoView();
(function poll() {
  if (!document.querySelector("#tokens .turn-tokens:not(.pending) .tok")) return requestAnimationFrame(poll);
  requestAnimationFrame(function () { requestAnimationFrame(function () { done(performance.now() - t0); }); });
})();
"""
DRAW_ALL = """
var done = arguments[arguments.length - 1], t0 = performance.now();
document.getElementById("tokens-all").click();
requestAnimationFrame(function () { requestAnimationFrame(function () {
  done([performance.now() - t0, document.querySelectorAll("#tokens .tok").length]);
}); });
"""


@dataclass
class BrowserTimes:
    """Client-side seconds (lists over rounds) of one backend's session pages."""

    cold: list[float]
    cold_served: list[float]
    warm: list[float]
    warm_served: list[float]
    small: list[float]
    scroll: list[float]
    draw_all: list[float]
    spans: int


def browser_times(base: str, big: list[str], small: str, repeat: int) -> BrowserTimes | None:
    """Usable times of the session pages in headless Chromium (None without it); see the docstring."""
    if not (Path("/usr/bin/chromium").exists() and Path("/usr/bin/chromedriver").exists()):
        return None
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    options.binary_location = "/usr/bin/chromium"
    driver = webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
    driver.set_script_timeout(60)

    def load(sid: str) -> tuple[float, float]:
        driver.get(f"{base}/session?id={sid}")
        ready, served = driver.execute_async_script(READY)
        return ready / 1000, served / 1000

    try:
        load(small)  # warm-up: the browser process, the server's tokenizer
        t = BrowserTimes([], [], [], [], [], [], [], 0)
        for sid in big:
            driver.get("about:blank")
            driver.execute_cdp_cmd("Network.clearBrowserCache", {})
            ready, served = load(sid)
            t.cold.append(ready)
            t.cold_served.append(served)
        for _ in range(repeat):
            ready, served = load(big[0])
            t.warm.append(ready)
            t.warm_served.append(served)
            t.scroll.append(driver.execute_async_script(SCROLL) / 1000)
            ms, t.spans = driver.execute_async_script(DRAW_ALL)
            t.draw_all.append(ms / 1000)
            t.small.append(load(small)[0])
        return t
    finally:
        driver.quit()


def ms(values: list[float]) -> str:
    """best / median in milliseconds."""
    return f"{min(values) * 1000:,.0f} / {statistics.median(values) * 1000:,.0f}"


def measure(backend: str, a: argparse.Namespace) -> tuple[list[str], list[str] | None]:
    """One backend's rows of the two tables (server, browser)."""
    with migrated_database(backend, a.pg_url) as url, tempfile.TemporaryDirectory() as home:
        settings = Settings(database_url=url, home=Path(home))
        writer = EventStore.open(settings=settings)
        big = [build_session(writer, "bench", a.turns, a.tokens) for _ in range(a.cold + 1)]
        small = build_session(writer, "bench", 1, a.tokens // a.turns)
        n_tokens = sum(
            t.context_ids.size + t.generated_ids.size for t in writer.turns.read(session_id=big[0])
        )
        writer.close()
        store = open_readonly_store(settings)
        app = create_app(store)
        server = ThreadedServer(app, server=lambda config: ViewServer(config, app.state.live))
        server.start()
        try:
            page = f"{server.base}/session?id={big[-1]}"
            with httpx.Client(timeout=60) as client:
                client.get(f"{server.base}/session?id={small}").raise_for_status()  # warm-up
                size = len(client.get(page).content)
                served = timed(lambda: client.get(page).raise_for_status(), a.repeat)
            read = timed(lambda: store.turns.read(session_id=big[-1], with_experts=False), a.repeat)
            times = browser_times(server.base, big[:-1], small, a.repeat)
        finally:
            server.stop()
            store.close()
    med, rmed = statistics.median(served), statistics.median(read)
    server_row = [
        backend,
        f"{n_tokens:,}",
        f"{size / 1024:,.0f}",
        ms(read),
        ms(served),
        f"{med / rmed:.1f}x",
        "met" if med < 0.3 else "NOT met",
    ]
    if times is None:
        return server_row, None
    cold, warm = statistics.median(times.cold), statistics.median(times.warm)
    browser_row = [
        backend,
        ms(times.cold),
        ms(times.cold_served),
        ms(times.warm),
        ms(times.warm_served),
        ms(times.small),
        f"{warm / statistics.median(times.small):.1f}x",
        "met" if max(cold, warm) < 1 else "NOT met",
        ms(times.scroll),
        f"{ms(times.draw_all)} ({times.spans:,} spans)",
    ]
    return server_row, browser_row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--backends", default="sqlite,postgresql")
    p.add_argument("--turns", type=int, default=100)
    p.add_argument("--tokens", type=int, default=30_000)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--cold", type=int, default=3, help="cold page loads (one new session each)")
    a = p.parse_args()
    title = f"session page: {a.turns} turns, ~{a.tokens:,} tokens (best / median ms)"
    served = Table(title=f"{title}, served")
    for col in ("backend", "tokens", "page KB", "read_turns", "served", "served/read", "target 300 ms"):
        served.add_column(col)
    browser = Table(title=f"{title}, in headless Chromium (client-side)")
    for col in (
        "backend",
        "usable cold",
        "served cold",
        "usable warm",
        "served warm",
        "1-turn page (baseline)",
        "warm/baseline",
        "target 1 s",
        "tokens on scroll",
        "draw all",
    ):
        browser.add_column(col)
    for backend in a.backends.split(","):
        server_row, browser_row = measure(backend, a)
        served.add_row(*server_row)
        if browser_row is not None:
            browser.add_row(*browser_row)
    console.print(served)
    console.print(
        browser if browser.row_count else "usable: no /usr/bin/chromium + chromedriver, not measured"
    )


if __name__ == "__main__":
    main()
