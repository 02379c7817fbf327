"""Fixtures: real `tether serve` processes and PubNub SDK clients pointed at them.

TETHER_BIN selects the binary (default /work/main/.build/debug/tether).
TETHER_TEST_DATABASE_URL (postgres://user@127.0.0.1:port/db, set by scripts/test) is the
PostgreSQL the PostgreSQL tests make their databases in; without it they start their own with
scripts/postgres, or skip when PostgreSQL is not installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal

import pytest
import pytest_asyncio

from helpers import (TETHER_BIN, PostgresServer, TetherServer, create_database, drop_database, make_config,
                     postgres_unavailable_reason, run_with_callback, stop_asyncio_clients, stop_clients)

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


# ---------------------------------------------------------------------------------------------
# PostgreSQL (issue #19)
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def postgres_url():
    """The URL of a PostgreSQL the tests may create databases in: TETHER_TEST_DATABASE_URL when
    set (scripts/test starts one for the run), else one this session starts with
    scripts/postgres and stops at its end; skips the test when PostgreSQL is not installed."""
    url = os.environ.get("TETHER_TEST_DATABASE_URL")
    if url:
        yield url
        return
    reason = postgres_unavailable_reason()
    if reason:
        pytest.skip(reason)
    server = PostgresServer()
    try:
        yield server.start().url
    finally:
        server.close()


@pytest.fixture
def postgres_database(postgres_url):
    """A fresh, empty database of the test's own (`t_<random>`) on `postgres_url`; its URL.
    Dropped at teardown, disconnecting whatever is still on it. Request it before
    `server_factory` so the nodes on it are stopped first."""
    url = create_database(postgres_url)
    yield url
    drop_database(url, postgres_url)


@pytest.fixture
def private_postgres():
    """A PostgreSQL of this test alone (`helpers.PostgresServer`, started), for tests that stop
    or restart the server itself; stopped and removed at teardown. Skips the test when
    PostgreSQL is not installed."""
    reason = postgres_unavailable_reason()
    if reason:
        pytest.skip(reason)
    server = PostgresServer()
    try:
        yield server.start()
    finally:
        server.close()


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
    stop_clients(clients)


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
    await stop_asyncio_clients(clients)


# ---------------------------------------------------------------------------------------------
# One test body, both SDK flavours (presence and channel-group tests)
# ---------------------------------------------------------------------------------------------

class SdkError:
    """What an SDK reported for a failed call: HTTP status, status category, response body text."""

    def __init__(self, status_code, category, body, operation=None):
        self.status_code = status_code
        self.category = category
        self.body = body  # the parsed JSON error body
        self.operation = operation

    def __repr__(self):
        return f"<SdkError {self.status_code} {self.category} {self.operation} {self.body!r}>"


class SdkFlavour:
    """Makes clients of one SDK flavour ("threaded" `PubNub` or "asyncio" `PubNubAsyncio`) and
    runs endpoint builders from `async` tests: `await sdk.call(builder)` returns the envelope of
    a successful call (threaded: `.sync()` on a worker thread; asyncio: `.future()`), and
    `await sdk.call_error(builder)` returns the `SdkError` of a failed one."""

    def __init__(self, name: str):
        self.name = name
        self.clients: list = []

    @property
    def threaded(self) -> bool:
        return self.name == "threaded"

    def make(self, origin: str, uuid: str | None = None, **overrides):
        from helpers import make_config
        if self.threaded:
            from pubnub.pubnub import PubNub
            pn = PubNub(make_config(origin, uuid, **overrides))
        else:
            from pubnub.pubnub_asyncio import PubNubAsyncio
            pn = PubNubAsyncio(make_config(origin, uuid, **overrides))
        self.clients.append(pn)
        return pn

    async def call(self, builder):
        if self.threaded:
            return await asyncio.to_thread(builder.sync)
        env = await builder.future()
        assert not env.status.is_error(), (env.status.status_code, env.status.error_data)
        return env

    async def call_error(self, builder) -> SdkError:
        if self.threaded:
            # `.sync()` raises without a status; the callback API reports the status object.
            done, got = run_with_callback(builder)
            assert await asyncio.to_thread(done.wait, 20), "no callback within 20 s"
            result, status = got[0]
        else:
            env = await builder.future()
            result, status = env.result, env.status
        assert status.is_error(), f"expected an error, got {result!r}"
        exc = status.error_data.exception if status.error_data else None
        body = getattr(exc, "_errormsg", None)
        if isinstance(body, str):
            body = json.loads(body)
        return SdkError(status.status_code, status.category, body, status.operation)

    async def close(self):
        for pn in self.clients:
            with contextlib.suppress(Exception):
                pn.unsubscribe_all()
        await asyncio.sleep(0)
        for pn in self.clients:
            with contextlib.suppress(Exception):
                if self.threaded:
                    await asyncio.to_thread(pn.stop)
                else:
                    await pn.stop()


@pytest_asyncio.fixture(params=["threaded", "asyncio"])
async def sdk(request):
    """Parametrizes an `async` test over both SDK flavours; clients made with `sdk.make(origin)`
    are unsubscribed and stopped at teardown."""
    flavour = SdkFlavour(request.param)
    yield flavour
    await flavour.close()
