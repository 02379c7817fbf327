"""The PostgreSQL test harness itself (scripts/postgres and the conftest fixtures): every test
gets a database of its own, and a private server restarts on the same port with its data.
Runs without any Tether PostgreSQL support; skips when PostgreSQL is not installed."""

from __future__ import annotations

import urllib.parse

import pytest

from helpers import psql

# Databases the tests of this module were given, in order (pytest runs a module's tests in order).
_seen: list[str] = []


def test_each_test_gets_its_own_empty_database(postgres_url, postgres_database):
    name = urllib.parse.urlsplit(postgres_database).path.lstrip("/")
    assert name.startswith("t_")
    assert psql(postgres_database, "SELECT current_database()") == name
    # Empty: no table of anyone else's.
    assert psql(postgres_database, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == "0"
    psql(postgres_database, "CREATE TABLE marker (v int); INSERT INTO marker VALUES (1)")
    assert psql(postgres_url, f"SELECT 1 FROM pg_database WHERE datname = '{name}'") == "1"
    _seen.append(name)


def test_the_previous_tests_database_was_dropped(postgres_url, postgres_database):
    previous = _seen[-1] if _seen else None
    if previous is None:
        pytest.skip("run together with test_each_test_gets_its_own_empty_database (it runs first)")
    assert previous != urllib.parse.urlsplit(postgres_database).path.lstrip("/")
    assert psql(postgres_url, f"SELECT count(*) FROM pg_database WHERE datname = '{previous}'") == "0"
    assert psql(postgres_database, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == "0"


def test_the_server_is_loopback_only_with_fsync_on(postgres_url):
    settings = dict(line.split("|") for line in psql(
        postgres_url, "SELECT name, setting FROM pg_settings WHERE name IN "
                      "('listen_addresses', 'fsync', 'max_connections')").splitlines())
    if urllib.parse.urlsplit(postgres_url).hostname == "127.0.0.1":
        assert settings["listen_addresses"] in ("127.0.0.1", "localhost"), settings
    assert settings["fsync"] == "on", settings
    assert int(settings["max_connections"]) >= 200, settings


def test_a_private_server_restarts_on_the_same_port_with_its_data(private_postgres):
    url, port, pid = private_postgres.url, private_postgres.port, private_postgres.pid
    psql(url, "CREATE TABLE kept (v text); INSERT INTO kept VALUES ('acknowledged')")
    private_postgres.stop()
    assert not private_postgres.running
    with pytest.raises(AssertionError, match="psql on"):
        psql(url, "SELECT 1", timeout=10)
    private_postgres.start()
    assert (private_postgres.url, private_postgres.port) == (url, port)
    assert private_postgres.pid != pid
    assert psql(url, "SELECT v FROM kept") == "acknowledged"
