"""Viewer benchmark: how fast a big session page is served and becomes usable in the browser.

Builds one session of ``--turns`` turns and about ``--tokens`` tokens (real Qwen3.5 ids of English
text and tool-call markup, routed experts 8 layers x top-2) per backend, serves the viewer on
loopback (uvicorn, as ``dressage-worker view`` does) and measures, best and median of
``--repeat`` rounds:

* ``served``: GET of the session page (conversation, segments, token view data) until the last
  byte; target < 300 ms;
* baseline, same run: ``read_turns``, the store's read of the same session (the least any view of
  it must do); the ratio served / read_turns says what the page adds;
* ``usable``: headless Chromium (when ``/usr/bin/chromium`` and ``chromedriver`` are installed)
  from navigation until every token span is on the page; target < 1 s.

    python bench/view_session.py [--pg-url URL] [--backends sqlite,postgresql] [--turns 100]
        [--tokens 30000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.loopback

import httpx
import numpy as np
from bench_db import fresh_database
from rich.console import Console
from rich.table import Table

from dressage.config import Settings
from dressage.store import EventStore, TurnRecord
from dressage.store.db import upgrade
from dressage.tito.tokenizer import load_qwen35_tokenizer
from dressage.view.app import create_app
from dressage.view.readonly import open_readonly_store
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
    store.create_run(run)
    sid = f"bench-{uuid.uuid4().hex[:8]}"
    store.open_session(run, session_id=sid, agent="bench")
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
        store.append_turn(
            run,
            TurnRecord(
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
    store.finalize_session(sid, "finished", reward=1.0, finish_reason="stop")
    return sid


def timed(fn: object, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append(time.perf_counter() - t0)
    return out


def browser_times(page: str, n_spans: int, repeat: int) -> list[float] | None:
    """Seconds from navigation to every token span present, in headless Chromium (None without it)."""
    if not (Path("/usr/bin/chromium").exists() and Path("/usr/bin/chromedriver").exists()):
        return None
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    options.binary_location = "/usr/bin/chromium"
    driver = webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
    try:
        driver.get(page)  # warm the cache of static files
        out = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            driver.get(page)
            WebDriverWait(driver, 30, poll_frequency=0.01).until(
                lambda d: (
                    d.execute_script("return document.querySelectorAll('#tokens .tok').length") >= n_spans
                )
            )
            out.append(time.perf_counter() - t0)
        return out
    finally:
        driver.quit()


@contextlib.contextmanager
def database(backend: str, pg_url: str) -> Iterator[str]:
    if backend == "postgresql":
        with fresh_database(pg_url) as db:
            yield db.url
    else:
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{tmp}/bench.db"
            upgrade(url)
            yield url


def measure(backend: str, a: argparse.Namespace) -> list[str]:
    """One backend's row of the table."""
    with database(backend, a.pg_url) as url, tempfile.TemporaryDirectory() as home:
        settings = Settings(database_url=url, home=Path(home))
        writer = EventStore.open(settings=settings)
        sid = build_session(writer, "bench", a.turns, a.tokens)
        n_tokens = sum(t.context_ids.size + t.generated_ids.size for t in writer.read_turns(session_id=sid))
        writer.close()
        store = open_readonly_store(settings)
        server = ThreadedServer(create_app(store))
        server.start()
        try:
            page = f"{server.base}/session?id={sid}"
            with httpx.Client(timeout=60) as client:
                size = len(client.get(page).content)  # warm-up (tokenizer load, caches)
                served = timed(lambda: client.get(page).raise_for_status(), a.repeat)
            read = timed(lambda: store.read_turns(session_id=sid, with_experts=False), a.repeat)
            from dressage.view.decode import default_decoder
            from dressage.view.tokens import token_payload

            turns = store.read_turns(session_id=sid, with_experts=False)
            spans = sum(
                len(tu["t"]) for s in token_payload(turns, default_decoder())["segments"] for tu in s["turns"]
            )
            usable = browser_times(page, spans, max(3, a.repeat // 2))
        finally:
            server.stop()
            store.close()
    best, med = min(served) * 1000, statistics.median(served) * 1000
    rbest, rmed = min(read) * 1000, statistics.median(read) * 1000
    ubest = umed = None
    if usable:
        ubest, umed = min(usable) * 1000, statistics.median(usable) * 1000
    return [
        backend,
        f"{n_tokens:,}",
        f"{size / 1024:,.0f}",
        f"{rbest:.0f} / {rmed:.0f}",
        f"{best:.0f} / {med:.0f}",
        f"{med / rmed:.1f}x",
        "met" if med < 300 else "NOT met",
        "-" if umed is None else f"{ubest:.0f} / {umed:.0f}",
        "-" if umed is None else ("met" if umed < 1000 else "NOT met"),
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--backends", default="sqlite,postgresql")
    p.add_argument("--turns", type=int, default=100)
    p.add_argument("--tokens", type=int, default=30_000)
    p.add_argument("--repeat", type=int, default=7)
    a = p.parse_args()
    table = Table(title=f"session page: {a.turns} turns, ~{a.tokens:,} tokens (best / median ms)")
    for col in (
        "backend",
        "tokens",
        "page KB",
        "read_turns",
        "served",
        "served/read",
        "target 300 ms",
        "usable (browser)",
        "target 1 s",
    ):
        table.add_column(col)
    for backend in a.backends.split(","):
        table.add_row(*measure(backend, a))
    console.print(table)


if __name__ == "__main__":
    main()
