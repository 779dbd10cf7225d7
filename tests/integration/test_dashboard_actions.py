"""The dashboard with its actions enabled and a shared secret, in a headless browser, against a
LocalCluster over a real ZooKeeper whose bookies ask every client for the same secret: the page
(and its API) refuse a request without the secret; with it (the browser sends it as a bearer
token), entries are read from the bookies (the dashboard authenticates to them with the secret),
a bookie is set read-only and back through the confirmation dialog, GC runs, and a ledger is
deleted. Every wait has a deadline; what a test starts it stops, by PID."""

from __future__ import annotations

import secrets
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from bookkeeper_py.auth import SharedSecretClientAuthProvider
from bookkeeper_py.client.facade import BookKeeper
from bookkeeper_py.metadata.manager import MetadataClient
from bookkeeper_py.testing.local_cluster import LocalCluster
from bookkeeper_py.testing.zookeeper import ZooKeeperServer

from .test_dashboard import _open, _states, _wait_dom, chromium, serving

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.zookeeper]


@pytest.fixture(scope="module")
def cluster(zookeeper: ZooKeeperServer, secret_file: Path) -> Iterator[LocalCluster]:
    uri = zookeeper.metadata_uri(f"/dashboard-actions-{secrets.token_hex(6)}/ledgers")
    auth = ["--auth-provider", "shared-secret", "--auth-secret-file", str(secret_file)]
    with LocalCluster(3, metadata_uri=uri, bookie_args=auth) as local:
        yield local


@pytest.fixture(scope="module")
def dashboard(
    cluster: LocalCluster, secret_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    flags = ("--enable-actions", "--secret-file", str(secret_file))
    with serving(cluster.metadata_uri, tmp_path_factory.mktemp("dashboard"), *flags) as address:
        yield address


@pytest.fixture(scope="module")
def browser(secret_file: Path) -> Iterator[webdriver.Chrome]:
    """The browser sends the secret with every request (as a proxy or an SSO gateway would)."""
    with chromium() as driver:
        token = secret_file.read_text().strip()
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd(
            "Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Bearer {token}"}}
        )
        yield driver


def _client(cluster: LocalCluster, secret_file: Path) -> BookKeeper:
    secret = secret_file.read_text().strip().encode()
    return BookKeeper(cluster.metadata_uri, auth=SharedSecretClientAuthProvider(secret, "test"))


def _confirm(browser: webdriver.Chrome, selector: str, expected_text: str) -> None:
    """Clicks ``selector``, checks the dialog's question, confirms."""
    browser.find_element(By.CSS_SELECTOR, selector).click()
    _wait_dom(
        "the confirmation dialog", lambda: browser.find_element(By.ID, "confirm").is_displayed()
    )
    assert expected_text in browser.find_element(By.ID, "confirm-text").text
    browser.find_element(By.ID, "confirm-ok").click()


def test_requests_without_the_secret_refused(dashboard: str) -> None:
    for path in ("", "api/overview", "static/dashboard.js"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(dashboard + path, timeout=10)
        assert refused.value.code == 401
        assert "secret" in refused.value.read().decode()


def test_entries_read_from_bookies_that_ask_for_the_secret(
    cluster: LocalCluster, secret_file: Path, dashboard: str, browser: webdriver.Chrome
) -> None:
    with _client(cluster, secret_file) as bk:
        handle = bk.create_ledger(3, 2, 2, password=b"never-shown-password")
        for index in range(5):
            handle.add_entry(f"secret entry {index}".encode())
        handle.close()
    _open(browser, dashboard, f"#ledger/{handle.ledger_id}")
    _wait_dom("the ledger's page", lambda: browser.find_element(By.ID, "ledger").is_displayed())
    browser.find_element(By.CSS_SELECTOR, "#entry-form button").click()
    _wait_dom(
        "entries 0 to 4 read through authenticated connections",
        lambda: (
            [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#entries pre")]
            == [f"secret entry {index}" for index in range(5)]
        ),
    )
    assert "never-shown-password" not in browser.page_source


def test_read_only_and_back(
    cluster: LocalCluster, dashboard: str, browser: webdriver.Chrome
) -> None:
    _open(browser, dashboard)
    bookie = cluster.bookie_ids[1]
    row = f'#bookie-table tr[data-bookie-id="{bookie}"]'
    _wait_dom("the bookie up", lambda: _states(browser).get(bookie) == "read-write")
    assert "actions enabled" in browser.find_element(By.ID, "mode").text
    _confirm(browser, row + " button.set-readonly", f"Set read-only: bookie {bookie}")
    _wait_dom("the bookie shown read-only", lambda: _states(browser).get(bookie) == "read-only")
    with MetadataClient.connect(cluster.metadata_uri) as metadata:
        assert bookie in metadata.readonly_bookies()
    _confirm(browser, row + " button.set-readonly", f"Set writable: bookie {bookie}")
    _wait_dom("the bookie writable again", lambda: _states(browser).get(bookie) == "read-write")
    with MetadataClient.connect(cluster.metadata_uri) as metadata:
        assert bookie in metadata.writable_bookies()


def test_gc_and_ledger_deletion(
    cluster: LocalCluster, secret_file: Path, dashboard: str, browser: webdriver.Chrome
) -> None:
    _open(browser, dashboard)
    bookie = cluster.bookie_ids[0]
    row = f'#bookie-table tr[data-bookie-id="{bookie}"]'
    _wait_dom("the bookie up", lambda: _states(browser).get(bookie) == "read-write")
    _confirm(browser, row + " button.trigger-gc", f"garbage collection now on bookie {bookie}")
    _wait_dom("GC started", lambda: "Done:" in browser.find_element(By.ID, "alert").text)
    with _client(cluster, secret_file) as bk:
        handle = bk.create_ledger(3, 2, 2, password=b"pw")
        handle.add_entry(b"to be deleted")
        handle.close()
    _open(browser, dashboard, f"#ledger/{handle.ledger_id}")
    _wait_dom(
        "the ledger's page",
        lambda: browser.find_element(By.ID, "ledger-title").text == f"Ledger {handle.ledger_id}",
    )
    _confirm(browser, "#ledger-delete", f"Delete ledger {handle.ledger_id}?")
    # (the GC's "Done:" may still be shown: wait for the deletion's own answer)
    _wait_dom(
        "the deletion done",
        lambda: f'"deleted":{handle.ledger_id}' in browser.find_element(By.ID, "alert").text,
    )
    with MetadataClient.connect(cluster.metadata_uri) as metadata:
        assert handle.ledger_id not in list(metadata.list_ledgers())
