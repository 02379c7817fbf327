"""Fixtures: real `tether serve` processes and PubNub SDK clients pointed at them.

TETHER_BIN selects the binary (default /work/main/.build/debug/tether).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import pytest
import pytest_asyncio

from helpers import TETHER_BIN, TetherServer, make_config

# Long-polls on the shared fixture answer after this many seconds, so a stray SDK thread never
# outlives a test by long; tests of the long-poll itself start their own servers.
DEFAULT_SUBSCRIBE_TIMEOUT = "20"


def pytest_report_header(config):
    return f"tether binary: {TETHER_BIN}"


def pytest_configure(config):
    if not os.access(TETHER_BIN, os.X_OK):
        raise pytest.UsageError(f"tether binary not found or not executable: {TETHER_BIN} "
                                "(build it with `swift build --product tether` or set TETHER_BIN)")


class ServerFactory:
    """Starts servers with custom arguments; every server still running at teardown is stopped
    with SIGTERM and must exit 0."""

    def __init__(self, tmp_path_factory):
        self._tmp = tmp_path_factory
        self.servers: list[TetherServer] = []

    def new_data_dir(self) -> str:
        return str(self._tmp.mktemp("tether-data"))

    def create(self, args=(), data_dir: str | None = None, env: dict | None = None,
               log_level: str = "warning") -> TetherServer:
        data_dir = data_dir or self.new_data_dir()
        log_path = str(self._tmp.mktemp("tether-log") / "server.log")
        server = TetherServer(data_dir, args=args, env=env, log_level=log_level, log_path=log_path)
        self.servers.append(server)
        return server

    def start(self, args=(), data_dir: str | None = None, env: dict | None = None, **kw) -> TetherServer:
        return self.create(args, data_dir, env, **kw).start()

    def close(self):
        failures = []
        for server in self.servers:
            if server.running:
                code = server.stop(signal.SIGTERM)
                if code != 0:
                    failures.append(f"{server!r} exited {code} on SIGTERM; log:\n{server.log_text()}")
        assert not failures, "\n".join(failures)


@pytest.fixture
def server_factory(tmp_path_factory):
    factory = ServerFactory(tmp_path_factory)
    yield factory
    factory.close()


@pytest.fixture(scope="module")
def module_server_factory(tmp_path_factory):
    """Like `server_factory`, for servers shared by every test of a module."""
    factory = ServerFactory(tmp_path_factory)
    yield factory
    factory.close()


@pytest.fixture
def server(server_factory) -> TetherServer:
    """A fresh server on port 0 with its own data dir; stopped with SIGTERM (must exit 0)."""
    return server_factory.start(args=["--subscribe-timeout", DEFAULT_SUBSCRIBE_TIMEOUT])


@pytest.fixture
def origin(server) -> str:
    return server.origin


@pytest.fixture
def make_pubnub(server):
    """Factory of threaded `PubNub` clients aimed at the fixture server (or another origin)."""
    from pubnub.pubnub import PubNub

    clients = []

    def make(uuid: str | None = None, origin: str | None = None, **overrides):
        pn = PubNub(make_config(origin or server.origin, uuid, **overrides))
        clients.append(pn)
        return pn

    yield make
    for pn in clients:
        try:
            pn.unsubscribe_all()
        except Exception:
            pass
        try:
            pn.stop()
        except Exception:
            pass


@pytest.fixture
def pubnub(make_pubnub):
    return make_pubnub()


@pytest_asyncio.fixture
async def make_pubnub_asyncio(server):
    """Factory of `PubNubAsyncio` clients (event engine) for `async` tests; each is
    unsubscribed and stopped at teardown, inside the test's event loop."""
    from pubnub.pubnub_asyncio import PubNubAsyncio

    clients = []

    def make(uuid: str | None = None, origin: str | None = None, **overrides):
        pn = PubNubAsyncio(make_config(origin or server.origin, uuid, **overrides))
        clients.append(pn)
        return pn

    yield make
    for pn in clients:
        with contextlib.suppress(Exception):
            pn.unsubscribe_all()
    await asyncio.sleep(0)
    for pn in clients:
        with contextlib.suppress(Exception):
            await pn.stop()
