"""The lean ``/generate`` client (dressage.engines.http1) against a real HTTP server on loopback.

The server is raw asyncio HTTP/1.1, so each test decides exactly what goes on the wire: keep-alive
or close, sized or chunked bodies cut at awkward places, a 5xx, a connection dropped mid-answer,
no answer at all. Every case goes through :class:`EngineClient`, as the proxy calls it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest

from dressage.engines import EngineClient, SamplingParams
from dressage.engines.ids_json import IdsJson
from dressage.errors import EngineError, EngineHTTPError
from dressage.tito.incremental import PromptIds

pytestmark = pytest.mark.anyio

Writer = asyncio.StreamWriter
Answer = Callable[[dict[str, Any], Writer], Awaitable[bool]]
"""Writes the answer to one request; returns whether to keep the connection open."""


def answer_body(req: dict[str, Any], ids: list[int] | None = None) -> dict[str, Any]:
    """A finished ``/generate`` answer (one chunk's worth when streaming)."""
    out = ids or [7, 8, 9]
    return {
        "text": "",
        "output_ids": out,
        "meta_info": {
            "id": req.get("rid") or "x",
            "finish_reason": {"type": "stop", "matched": out[-1]},
            "prompt_tokens": len(req["input_ids"]),
            "completion_tokens": len(out),
            "cached_tokens": 0,
            "weight_version": "0",
            "output_token_logprobs": [[-0.5, t, None] for t in out],
        },
    }


def sized(status: str, body: bytes, extra: bytes = b"") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n".encode()
        + extra
        + b"\r\n"
        + body
    )


class RawServer:
    """HTTP/1.1 on loopback: counts connections, keeps the requests, answers with ``answer``."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[dict[str, Any]] = []
        self.writers: list[Writer] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: Writer) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                length = next(int(v.split(":")[1]) for v in lines if v.lower().startswith("content-length"))
                req = json.loads(await reader.readexactly(length))
                self.requests.append(req)
                if not await self.answer(req, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[str]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        try:
            yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        finally:
            server.close()
            for w in self.writers:
                w.close()


async def keep_alive(req: dict[str, Any], writer: Writer) -> bool:
    writer.write(sized("200 OK", orjson.dumps(answer_body(req))))
    await writer.drain()
    return True


PARAMS = SamplingParams(max_new_tokens=3)


async def test_keep_alive_connection_is_reused_and_ids_arrive_whole() -> None:
    server = RawServer(keep_alive)
    prefix = list(range(1000))
    async with server.running() as url, EngineClient(url) as client:
        for turn in range(5):
            prompt = PromptIds(prefix, len(prefix), (turn, turn + 1))
            result = await client.generate(prompt, PARAMS, rid=f"r{turn}")
            assert result.output_ids == [7, 8, 9] and result.logprobs == [-0.5] * 3
            assert server.requests[-1]["input_ids"] == [*prefix, turn, turn + 1]
            assert server.requests[-1]["sampling_params"] == {"max_new_tokens": 3}
            prefix += [5000 + turn] * 10  # the segment grows by the turn's output
    assert server.connections == 1


async def test_a_connection_the_server_closed_while_idle_is_not_reused() -> None:
    async def close_after(req: dict[str, Any], writer: Writer) -> bool:
        await keep_alive(req, writer)  # says keep-alive, then closes (a keep-alive timeout)
        return False

    server = RawServer(close_after)
    async with server.running() as url, EngineClient(url) as client:
        for _ in range(3):
            await client.generate([1, 2, 3], PARAMS)
            await asyncio.sleep(0.05)  # the server's close reaches the client's socket
    assert server.connections == 3 and len(server.requests) == 3


async def test_connection_close_answers_are_not_reused() -> None:
    async def close_header(req: dict[str, Any], writer: Writer) -> bool:
        writer.write(sized("200 OK", orjson.dumps(answer_body(req)), b"Connection: close\r\n"))
        await writer.drain()
        return True  # the client must not send another request on it anyway

    server = RawServer(close_header)
    async with server.running() as url, EngineClient(url) as client:
        for _ in range(2):
            await client.generate([1], PARAMS)
    assert server.connections == 2


async def test_chunked_stream_cut_mid_line_is_parsed_and_the_connection_reused() -> None:
    ids = list(range(100, 110))

    async def stream(req: dict[str, Any], writer: Writer) -> bool:
        events = b""
        for n in range(2, len(ids) + 1, 2):  # cumulative chunks, as SGLang streams by default
            body = answer_body(req, ids[:n])
            if n < len(ids):
                body["meta_info"]["finish_reason"] = None
            events += b"data: " + orjson.dumps(body) + b"\n\n"
        events += b"data: [DONE]\n\n"
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        for i in range(0, len(events), 37):  # chunk borders fall inside lines and JSON
            piece = events[i : i + 37]
            writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            await writer.drain()
            await asyncio.sleep(0)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    server = RawServer(stream)
    async with server.running() as url, EngineClient(url) as client:
        for _ in range(2):
            got: list[int] = []
            deltas = [d async for d in client.generate_stream([1, 2], PARAMS)]
            for d in deltas:
                got += d.output_ids
            assert got == ids and deltas[-1].finished and not deltas[0].finished
            assert server.requests[-1]["stream"] is True
    assert server.connections == 1


async def test_engine_5xx_is_an_http_error_and_the_next_request_works() -> None:
    failures = [True]

    async def flaky(req: dict[str, Any], writer: Writer) -> bool:
        if failures.pop() if failures else False:
            writer.write(sized("503 Service Unavailable", b'{"error": "overloaded"}'))
            await writer.drain()
            return True
        return await keep_alive(req, writer)

    server = RawServer(flaky)
    async with server.running() as url, EngineClient(url) as client:
        with pytest.raises(EngineHTTPError, match=r"HTTP 503.*overloaded.*engine's log") as info:
            await client.generate([1], PARAMS)
        assert info.value.status_code == 503
        assert (await client.generate([1], PARAMS)).output_ids == [7, 8, 9]
        failures.append(True)
        with pytest.raises(EngineHTTPError, match="HTTP 503"):
            async for _ in client.generate_stream([1], PARAMS):
                pass


async def test_connection_lost_mid_answer_is_an_engine_error() -> None:
    async def cut(req: dict[str, Any], writer: Writer) -> bool:
        body = orjson.dumps(answer_body(req))
        writer.write(sized("200 OK", body)[: -len(body) // 2])
        await writer.drain()
        return False

    server = RawServer(cut)
    async with server.running() as url, EngineClient(url) as client:
        with pytest.raises(EngineError, match=rf"{url}/generate is unreachable \(ReadError: .*closed"):
            await client.generate([1], PARAMS)
        with pytest.raises(EngineError, match="ReadError"):
            async for _ in client.generate_stream([1], PARAMS):
                pass


async def test_no_answer_times_out_with_a_clear_error() -> None:
    async def silent(req: dict[str, Any], writer: Writer) -> bool:
        await asyncio.sleep(5)
        return False

    server = RawServer(silent)
    async with server.running() as url, EngineClient(url, timeout=0.2) as client:
        with pytest.raises(EngineError, match=rf"{url}/generate is unreachable \(ReadTimeout"):
            await client.generate([1], PARAMS)


async def test_nothing_listening_is_a_connect_error() -> None:
    server = RawServer(keep_alive)
    async with server.running() as url:
        pass  # closed: the port is free again
    async with EngineClient(url) as client:
        with pytest.raises(EngineError, match=rf"{url}/generate is unreachable \(ConnectError"):
            await client.generate([1], PARAMS)


async def test_requests_past_the_connection_cap_wait_for_a_connection() -> None:
    from dressage.engines.http1 import ConnectionPool

    server = RawServer(keep_alive)
    async with server.running() as url:
        pool = ConnectionPool("127.0.0.1", int(url.rsplit(":", 1)[1]), max_connections=1)

        async def one(i: int) -> bytes:
            async with pool.exchange("POST", "/generate", orjson.dumps({"input_ids": [i]})) as ex:
                return await ex.read()

        answers = await asyncio.gather(*(one(i) for i in range(4)))
        await pool.aclose()
    assert [orjson.loads(a)["meta_info"]["prompt_tokens"] for a in answers] == [1] * 4
    assert server.connections == 1 and len(server.requests) == 4


def test_ids_json_reuses_prefixes_and_matches_a_whole_encoding() -> None:
    enc = IdsJson(capacity=2)
    seg = [1, 2, 3]
    other = [9] * 5
    cases = []
    for step in range(6):
        cases.append(PromptIds(seg, len(seg), (100 + step,)))
        cases.append(PromptIds(seg, 2, ()))  # a fork inside the encoded text
        cases.append(PromptIds(other, step % 5, (1, 2)))  # a third list: evictions
        seg += [step] * (step + 1)
    cases += [PromptIds([], 0, ()), PromptIds([], 0, (4,)), [5, 6], (7,)]
    for ids in cases:
        assert enc.array(ids) == orjson.dumps(list(ids))
