"""The live debug console (issue #20, docs/console.md) in a real browser: Debian's `chromium`
driven by `chromium-driver` through selenium, headless.

- signing in: a wrong secret is refused on the page; the right one opens the console;
- a `tether subscribe --transport websocket` client connects through the fault proxy, the proxy
  resets its connection, and the client's timeline in the page shows the drop and the resume;
- "Try it" publishes from the page through the publish path and the subscriber prints the
  message; the page's own subscription (the normal subscribe endpoint) shows it too;
- plain HTTP: a wrong secret, a missing cookie and cross-site requests are refused.

With TETHER_CONSOLE_SCREENSHOTS=<dir> the browser test also saves a PNG of each view there
(scripts/console-screenshots writes docs/images/console-*.png this way)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse

import pytest

from helpers import TETHER_BIN, publish, request, unique
from test_websocket_cli import Subscriber, clean_env

pytestmark = pytest.mark.timeout(180)

SECRET = "console-test-secret-4711"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver") or ("/usr/bin/chromedriver" if os.path.exists("/usr/bin/chromedriver") else None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 20):
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "the process did not start listening"
            time.sleep(0.05)


@pytest.fixture
def console_server(server_factory):
    return server_factory.start(env={"TETHER_ADMIN_SECRET": SECRET})


# -- plain HTTP -------------------------------------------------------------------------------

def test_console_is_off_without_a_secret(server_factory):
    server = server_factory.start()
    assert request(server.origin, "GET", "/console").status == 404
    assert request(server.origin, "GET", "/admin/v1/overview", headers={"Authorization": f"Bearer {SECRET}"}).status == 404


def test_wrong_secret_missing_cookie_and_cross_site_requests_are_refused(console_server):
    origin = console_server.origin
    assert request(origin, "GET", "/admin/v1/clients").status == 401
    assert request(origin, "GET", "/admin/v1/clients", headers={"Authorization": "Bearer nope"}).status == 401
    assert request(origin, "GET", "/admin/v1/clients", headers={"Cookie": "tether_console=made-up"}).status == 401
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    wrong = request(origin, "POST", "/console/login", body=b"secret=nope", headers=form)
    assert wrong.status == 401 and SECRET.encode() not in wrong.body
    body = urllib.parse.urlencode({"secret": SECRET}).encode()
    cross = request(origin, "POST", "/console/login", body=body, headers={**form, "Origin": "https://evil.example"})
    assert cross.status == 403
    ok = request(origin, "POST", "/console/login", body=body, headers=form)
    assert ok.status == 303
    cookie = ok.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    session = cookie.split(";")[0]
    page = request(origin, "GET", "/console", headers={"Cookie": session})
    assert page.status == 200 and SECRET.encode() not in page.body
    csrf = page.body.decode().split('name="csrf-token" content="')[1].split('"')[0]
    publish_body = json.dumps({"channel": "x", "message": "1"}).encode()
    # Cookie without the CSRF token, or with it from another site: refused. Bearer: accepted.
    assert request(origin, "POST", "/admin/v1/publish", body=publish_body, headers={"Cookie": session}).status == 403
    assert request(origin, "POST", "/admin/v1/publish", body=publish_body,
                   headers={"Cookie": session, "X-CSRF-Token": csrf, "Sec-Fetch-Site": "cross-site"}).status == 403
    assert request(origin, "POST", "/admin/v1/publish", body=publish_body,
                   headers={"Cookie": session, "X-CSRF-Token": csrf, "Origin": "http://evil.example"}).status == 403
    assert request(origin, "POST", "/admin/v1/publish", body=publish_body,
                   headers={"Cookie": session, "X-CSRF-Token": csrf}).status == 200
    assert request(origin, "POST", "/admin/v1/publish", body=publish_body,
                   headers={"Authorization": f"Bearer {SECRET}"}).status == 200
    assert SECRET not in console_server.log_text()


def test_wrong_secrets_are_throttled_per_address(console_server):
    """Five wrong secrets within a minute from one address: further attempts from it — sign-in
    form or bearer token, right or wrong — get 429 with Retry-After until the minute has passed."""
    origin = console_server.origin
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    for _ in range(3):
        assert request(origin, "POST", "/console/login", body=b"secret=wrong-guess-000", headers=form).status == 401
    for _ in range(2):
        assert request(origin, "GET", "/admin/v1/overview", headers={"Authorization": "Bearer wrong-guess-000"}).status == 401
    throttled = request(origin, "POST", "/console/login", body=b"secret=wrong-guess-000", headers=form)
    assert throttled.status == 429
    assert 1 <= int(throttled.headers["retry-after"]) <= 60
    right = urllib.parse.urlencode({"secret": SECRET}).encode()
    assert request(origin, "POST", "/console/login", body=right, headers=form).status == 429
    bearer = request(origin, "GET", "/admin/v1/overview", headers={"Authorization": f"Bearer {SECRET}"})
    assert bearer.status == 429 and "retry-after" in bearer.headers
    assert SECRET not in console_server.log_text()


def test_the_admin_secret_can_come_from_the_config_file(server_factory, tmp_path):
    """`adminSecret` in the --config file turns the console on; the flag wins over it; neither is
    ever written to the log, and a short one is refused without being echoed."""
    path = tmp_path / "tether-config.json"
    path.write_text(json.dumps({"adminSecret": SECRET}))
    server = server_factory.start(args=["--config", str(path)])
    auth = lambda secret: {"Authorization": f"Bearer {secret}"}
    assert request(server.origin, "GET", "/admin/v1/overview", headers=auth(SECRET)).status == 200
    assert SECRET not in server.log_text()
    flag_secret = "flag-secret-wins-0815"
    flagged = server_factory.start(args=["--config", str(path), "--admin-secret", flag_secret])
    assert request(flagged.origin, "GET", "/admin/v1/overview", headers=auth(flag_secret)).status == 200
    assert request(flagged.origin, "GET", "/admin/v1/overview", headers=auth(SECRET)).status == 401
    short = tmp_path / "short.json"
    short.write_text(json.dumps({"adminSecret": "tooshort"}))
    result = subprocess.run([TETHER_BIN, "serve", "--config", str(short), "--port", "0", "--data-dir", str(tmp_path / "d")],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode != 0
    assert "adminSecret must be at least 12 characters" in result.stderr
    assert "tooshort" not in result.stderr + result.stdout


# -- the browser ------------------------------------------------------------------------------

def make_browser():
    if not CHROMIUM or not CHROMEDRIVER:
        pytest.skip("Debian's chromium and chromium-driver are not installed (scripts/test installs them with apt)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (Tests/Conformance/requirements.txt)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,900",
                "--force-device-scale-factor=1"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def test_the_console_shows_a_clients_drop_and_resume_and_publishes_to_a_subscriber(console_server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    shots = os.environ.get("TETHER_CONSOLE_SCREENSHOTS")
    browser = make_browser()
    origin = console_server.origin
    channel = unique("train")
    uuid = unique("rider")
    proxy_port, control_port = free_port(), free_port()
    proxy = subprocess.Popen([TETHER_BIN, "chaos", "proxy", "--listen", f"127.0.0.1:{proxy_port}", "--upstream", origin,
                              "--control", f"127.0.0.1:{control_port}", "--no-stdin"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=clean_env(), stdin=subprocess.DEVNULL)
    sub = None
    try:
        wait_port(proxy_port, proxy)
        wait_port(control_port, proxy)
        sub = Subscriber(channel, "--origin", f"127.0.0.1:{proxy_port}", "--transport", "websocket", "--policy", "linear",
                         "--user-id", uuid)
        sub.wait_for(lambda line: line.startswith("status connected"))
        for i in range(3):
            publish(origin, channel, {"n": i})
        sub.wait_for(lambda line: line.endswith('{"n":2}'))

        from selenium.common.exceptions import StaleElementReferenceException
        # The live views redraw every second: an element read mid-redraw is stale; wait on.
        wait = WebDriverWait(browser, 30, ignored_exceptions=(StaleElementReferenceException,))
        browser.get(f"http://{origin}/console")
        browser.find_element(By.ID, "secret").send_keys("not the secret")
        browser.find_element(By.ID, "login").click()
        assert "Wrong secret" in wait.until(lambda b: b.find_element(By.ID, "login-error")).text
        browser.find_element(By.ID, "secret").send_keys(SECRET)
        browser.find_element(By.ID, "login").click()
        wait.until(lambda b: "live" in b.find_element(By.ID, "live").text)
        assert SECRET not in browser.page_source

        browser.get(f"http://{origin}/console#clients/{uuid}")
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#timeline li[data-type='session-opened']"))

        # The network drops: the proxy resets every connection for two seconds.
        request(f"127.0.0.1:{control_port}", "POST", "/", body=b"reset for 2s")
        for i in range(3, 5):
            publish(origin, channel, {"n": i})
        sub.wait_for(lambda line: line.endswith('{"n":4}'), timeout=60)

        def timeline(b):
            # The page redraws the timeline every second: an item can go stale while it is read.
            from selenium.common.exceptions import StaleElementReferenceException
            for _ in range(20):
                try:
                    return [li.get_attribute("data-type") for li in b.find_elements(By.CSS_SELECTOR, "#timeline li")]
                except StaleElementReferenceException:
                    time.sleep(0.05)
            return []
        wait.until(lambda b: "resumed" in timeline(b) and "catch-up" in timeline(b))
        events = list(reversed(timeline(browser)))  # the page lists the newest first
        assert events.index("dropped") < events.index("resumed") < events.index("catch-up"), events
        text = browser.find_element(By.ID, "client-detail").text
        assert "websocket" in text and channel in text
        if shots:
            browser.save_screenshot(os.path.join(shots, "console-clients.png"))

        # Try it: subscribe in the page, publish from the page; the CLI subscriber and the page both get it.
        browser.get(f"http://{origin}/console#try")
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#try-keyset option"))
        for field, value in (("publish-channel", channel), ("subscribe-channel", channel)):
            element = browser.find_element(By.ID, field)
            element.clear()
            element.send_keys(value)
        browser.find_element(By.ID, "subscribe-button").click()
        wait.until(lambda b: "Subscribed" in b.find_element(By.ID, "subscribe-status").text)
        time.sleep(0.5)  # the page's handshake, then its long-poll
        message = browser.find_element(By.ID, "publish-message")
        message.clear()
        message.send_keys('{"from":"the console"}')
        browser.find_element(By.ID, "publish-button").click()
        wait.until(lambda b: "Sent" in b.find_element(By.ID, "publish-result").text)
        sub.wait_for(lambda line: line.endswith('{"from":"the console"}'))
        wait.until(lambda b: "the console" in b.find_element(By.ID, "try-received").text)
        if shots:
            browser.save_screenshot(os.path.join(shots, "console-try.png"))
            browser.get(f"http://{origin}/console#channels")
            wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, f"#channels-table tr[data-channel='{channel}']"))
            browser.save_screenshot(os.path.join(shots, "console-channels.png"))
            browser.get(f"http://{origin}/console#overview")
            for i in range(20):
                publish(origin, channel, {"n": 100 + i})
                time.sleep(0.15)
            wait.until(lambda b: b.find_element(By.ID, "ov-websocket").text not in ("", "–"))
            browser.save_screenshot(os.path.join(shots, "console-overview.png"))
            browser.delete_all_cookies()
            browser.get(f"http://{origin}/console")
            browser.save_screenshot(os.path.join(shots, "console-login.png"))
    finally:
        browser.quit()
        if sub is not None:
            sub.stop()
        proxy.kill()
        proxy.wait()
