"""Secrets that reach the proxy never land at rest: a canary in headers and engine error bodies.

Requests carry canary keys in their headers (bearer token of a finished session, ``x-api-key``, a
cookie) and the engine answers with errors that quote a canary; the proxy runs at debug log level.
Afterwards a full dump of the database and every log line are searched: zero hits.
"""

from __future__ import annotations

import io
import logging
import subprocess
from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from dressage.config import Settings
from dressage.proxy import ProxyServer
from dressage.redact import install_log_redaction
from dressage.store import EventStore
from tests.loopback import ThreadedServer
from tests.proxy.conftest import LoopThread

CANARY_KEY = "sk-canary-7f3a9c1e5b2d4f6a8c0e"
CANARY_CONFIGURED = "plain-canary-value-91827364"  # no key pattern: redacted because it is configured


def failing_engine() -> FastAPI:
    app = FastAPI()

    @app.post("/generate")
    async def generate(request: Request) -> JSONResponse:
        body = await request.json()
        status = 400 if body["sampling_params"].get("temperature") == 0.5 else 500
        message = f"engine refused: key {CANARY_KEY} and {CANARY_CONFIGURED} in config"
        return JSONResponse(
            {"error": {"message": message}}, status_code=status, headers={"set-cookie": f"k={CANARY_KEY}"}
        )

    @app.get("/model_info")
    async def info() -> dict[str, object]:
        return {"model_path": "failing", "max_context": 4096, "weight_version": "0"}

    return app


@pytest.fixture
def debug_log() -> Iterator[io.StringIO]:
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    installed = install_log_redaction([CANARY_CONFIGURED])
    yield buf
    for h, f in installed:
        h.removeFilter(f)
    root.removeHandler(handler)
    root.setLevel(level)


def _dump(store: EventStore, url: str) -> str:
    if store.db.dialect == "sqlite":
        raw = store.db.engine.raw_connection()
        try:
            return "\n".join(raw.driver_connection.iterdump())  # type: ignore[union-attr]
        finally:
            raw.close()
    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    return subprocess.run(["pg_dump", "--data-only", dsn], check=True, capture_output=True, text=True).stdout


def test_no_canary_at_rest(
    loop_thread: LoopThread, store: EventStore, db_url: str, debug_log: io.StringIO
) -> None:
    server_app = ThreadedServer(failing_engine())
    server_app.start()
    settings = Settings(secrets=[CANARY_CONFIGURED], admin_token="admin-canary-token-5555")
    proxy = ProxyServer(store, [server_app.base], settings=settings)
    loop_thread.call(proxy.start())
    try:
        run = f"canary-{store.db.dialect}"
        loop_thread.call(proxy.create_run(run, {"note": "no secrets here"}))
        s = loop_thread.call(proxy.open_session(run, agent="canary"))
        headers = {"x-api-key": CANARY_KEY, "cookie": f"session={CANARY_KEY}", "x-extra": CANARY_CONFIGURED}
        with httpx.Client(base_url=s.base_url, timeout=30, headers=headers) as http:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            bad = http.post("/chat/completions", json=body)
            rejected = http.post("/chat/completions", json={**body, "temperature": 0.5})
            streamed = http.post("/chat/completions", json={**body, "stream": True})
            anth = http.post("/messages", json={**body, "stream": True})
        for r in (bad, rejected, streamed, anth):
            assert CANARY_KEY not in r.text and CANARY_CONFIGURED not in r.text, r.text
        assert bad.status_code == 502 and rejected.status_code == 400
        with httpx.Client(base_url=proxy.base_url, timeout=30) as http:
            http.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {CANARY_KEY}"})
            http.post("/admin/runs", json={"name": "x"}, headers={"authorization": f"Bearer {CANARY_KEY}"})
        loop_thread.call(
            proxy.finalize_session(s.session_id, "failed", error=f"agent died holding {CANARY_KEY}")
        )
    finally:
        loop_thread.call(proxy.stop())
        server_app.stop()
    dump = _dump(store, db_url)
    assert "session_finalized" in dump  # the dump holds the log
    assert CANARY_KEY not in dump and CANARY_CONFIGURED not in dump
    logs = debug_log.getvalue()
    assert "set-cookie" in logs.lower() or "HTTP Request" in logs  # debug logging really ran
    assert CANARY_KEY not in logs and CANARY_CONFIGURED not in logs
