"""The WebSocket session protocol (docs/websocket-protocol.md) from an independent client: the
`websockets` package from PyPI against a real `tether serve` process."""

from __future__ import annotations

import asyncio
import json
import signal
import socket

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from helpers import parse_responses, publish, subscribe_raw, unique

SUBPROTOCOL = "tether.v1.json"


def ws_url(server) -> str:
    return f"ws://{server.origin}/v2/ws"


def hello(uuid: str = "py", resume: dict | None = None) -> str:
    frame = {"type": "hello", "v": 1, "subscribeKey": "demo", "publishKey": "demo", "uuid": uuid}
    if resume:
        frame["resume"] = resume
    return json.dumps(frame)


async def next_of(ws, kind: str, timeout: float = 10.0) -> dict:
    """The next frame of `kind`, skipping others (server pings among them)."""
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        if frame["type"] == kind:
            return frame


async def envelopes(ws, count: int) -> list[dict]:
    found: list[dict] = []
    while len(found) < count:
        frame = await next_of(ws, "messages")
        for envelope in frame["m"]:
            envelope["_cursor"] = frame["t"]["t"]
            found.append(envelope)
    return found


@pytest.mark.asyncio
async def test_upgrade_after_requests_on_the_same_connection(server):
    """A connection that first sent ordinary (hot-path) requests can still upgrade: the upgrade
    decision waits for the first request the hot path does not answer."""
    host, port = server.origin.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.sendall(b"GET /time/0 HTTP/1.1\r\nHost: x\r\n\r\nGET /time/0 HTTP/1.1\r\nHost: x\r\n\r\n")
    data = b""
    while len(parse_responses(data)[0]) < 2:
        data += sock.recv(65536)
    assert [r.status for r in parse_responses(data)[0]] == [200, 200]
    sock.setblocking(False)
    async with connect(ws_url(server), sock=sock, subprotocols=[SUBPROTOCOL]) as ws:
        assert ws.subprotocol == SUBPROTOCOL
        await ws.send(hello("after-rest"))
        welcome = await next_of(ws, "welcome")
        assert welcome["v"] == 1 and not welcome["resumed"]


def test_upgrade_pipelined_behind_a_request_is_not_lost(server):
    """An upgrade request sent in the same write as an ordinary one (so it waits behind that
    answer) still upgrades, and the session answers."""
    import base64
    import os
    import struct

    host, port = server.origin.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(b"GET /time/0 HTTP/1.1\r\nHost: x\r\n\r\n" + (
        "GET /v2/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: {SUBPROTOCOL}\r\n\r\n").encode())
    data = b""
    while b"\r\n\r\n" not in data.partition(b"HTTP/1.1 101")[2] and len(data) < 65536:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    answers, rest = parse_responses(data)
    assert [r.status for r in answers][:1] == [200], data
    assert b"HTTP/1.1 101" in data, data
    rest = data.partition(b"HTTP/1.1 101")[2].partition(b"\r\n\r\n")[2]
    # A masked text frame with the hello (RFC 6455 §5.2).
    payload = hello("pipelined").encode()
    mask = os.urandom(4)
    frame = bytes([0x81, 0x80 | 126]) + struct.pack("!H", len(payload)) + mask
    frame += bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    sock.sendall(frame)
    frames = []
    buffer = rest
    def more() -> bytes:
        chunk = sock.recv(65536)
        assert chunk, ("closed before the welcome", frames)
        return chunk

    while not any(f.get("type") == "welcome" for f in frames):
        while len(buffer) < 2:
            buffer += more()
        length = buffer[1] & 0x7F
        start = 2
        if length == 126:
            while len(buffer) < 4:
                buffer += more()
            length, start = struct.unpack("!H", buffer[2:4])[0], 4
        while len(buffer) < start + length:
            buffer += more()
        body, buffer = buffer[start:start + length], buffer[start + length:]
        frames.append(json.loads(body))
    sock.close()


@pytest.mark.asyncio
async def test_session_sees_what_a_long_poll_sees(server):
    channel = unique("ws")
    async with connect(ws_url(server), subprotocols=[SUBPROTOCOL]) as ws:
        assert ws.subprotocol == SUBPROTOCOL
        await ws.send(hello())
        welcome = await next_of(ws, "welcome")
        assert welcome["v"] == 1 and not welcome["resumed"] and len(welcome["resumeToken"]) == 32
        await ws.send(json.dumps({"type": "subscribe", "channels": [channel]}))
        subscribed = await next_of(ws, "subscribed")
        cursor = subscribed["cursor"]
        timetoken = await asyncio.to_thread(publish, server.origin, channel, {"n": 1})
        delivered = await envelopes(ws, 1)
        long_poll = await asyncio.to_thread(subscribe_raw, server.origin, channel, cursor)
        body = long_poll.json()
        assert [e["p"]["t"] for e in body["m"]] == [str(timetoken)]
        assert [e["p"]["t"] for e in delivered] == [str(timetoken)]
        assert delivered[0]["d"] == {"n": 1}
        # One cursor for both wires: the session's cursor is a long-poll cursor (the long-poll,
        # asked later, may answer with a later one: the visible cursor follows the clock).
        assert timetoken <= int(delivered[0]["_cursor"]) <= int(body["t"]["t"])
        await ws.send(json.dumps({"type": "publish", "requestId": "r1", "channel": channel, "message": "hi"}))
        ack = await next_of(ws, "ack")
        assert ack["requestId"] == "r1" and int(ack["timetoken"]) > timetoken
        await ws.send(json.dumps({"type": "teleport"}))
        error = await next_of(ws, "error")
        assert error["code"] == "unknownType"
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 10)
        assert closed.value.rcvd.code == 4404


@pytest.mark.asyncio
@pytest.mark.slow
async def test_restart_expires_the_session_and_the_cursor_catches_up(server):
    channel = unique("ws")
    async with connect(ws_url(server), subprotocols=[SUBPROTOCOL]) as ws:
        await ws.send(hello())
        token = (await next_of(ws, "welcome"))["resumeToken"]
        await ws.send(json.dumps({"type": "subscribe", "channels": [channel]}))
        await next_of(ws, "subscribed")
        first = await asyncio.to_thread(publish, server.origin, channel, "before")
        cursor = (await envelopes(ws, 1))[0]["_cursor"]
        assert cursor == str(first)
        stopped = asyncio.create_task(asyncio.to_thread(server.restart))
        drain = await next_of(ws, "notice")
        assert drain["notice"] == "drain" and drain["reconnectAfterMs"] >= 0 and drain["jitterMs"] >= 0
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 10)
        assert closed.value.rcvd.code == 1012
        await stopped
    missed = await asyncio.to_thread(publish, server.origin, channel, "while away")
    async with connect(ws_url(server), subprotocols=[SUBPROTOCOL]) as ws:
        await ws.send(hello(resume={"token": token, "cursor": cursor}))
        notice = await next_of(ws, "notice")
        assert notice["notice"] == "sessionExpired"
        assert not (await next_of(ws, "welcome"))["resumed"]
        await ws.send(json.dumps({"type": "subscribe", "channels": [channel], "cursor": cursor}))
        assert [e["p"]["t"] for e in await envelopes(ws, 1)] == [str(missed)]


@pytest.mark.asyncio
async def test_connection_limit_refuses_the_upgrade_with_503(server_factory):
    server = server_factory.start(args=["--ws-max-connections", "1"])
    async with connect(ws_url(server), subprotocols=[SUBPROTOCOL]) as ws:
        await ws.send(hello())
        await next_of(ws, "welcome")
        with pytest.raises(InvalidStatus) as refused:
            async with connect(ws_url(server), subprotocols=[SUBPROTOCOL]):
                pass
        assert refused.value.response.status_code == 503
        assert refused.value.response.headers["Retry-After"] == "5"
