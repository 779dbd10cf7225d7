"""The dashboard in a real headless browser (Chromium and chromedriver from the OS packages, which
the README's test command installs) against a LocalCluster of 3 bookies: the page lists them, a
ledger written here appears with its ensemble, the chart gets points under a write load, an
action is refused by a dashboard started without --enable-actions, screenshots at 1280x800 and on
a narrow screen, and a killed bookie shows as down. The dashboard is the real command
(``python -m bookkeeper_py dashboard``) on a free loopback port; every wait has a deadline; what
a test starts it stops, by PID."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bookkeeper_py.client.facade import BookKeeper
from bookkeeper_py.metadata.manager import MetadataClient
from bookkeeper_py.testing.local_cluster import LocalCluster
from bookkeeper_py.testing.waiting import wait_for

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import WebDriverException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
START_S = 30.0
SEEN_S = 20.0  # the page polls every second: what it must show, it shows well within this

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(3) as local:
        yield local


@contextlib.contextmanager
def serving(metadata_uri: str, directory: Path, *flags: str) -> Iterator[str]:
    """``bookkeeper dashboard`` with ``flags`` on a free loopback port until the block ends; its
    address, read from what it prints."""
    output = directory / "dashboard.out"
    with open(output, "w") as sink:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bookkeeper_py",
                "dashboard",
                "--metadata-uri",
                metadata_uri,
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                *flags,
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        found: list[str] = []

        def printed_address() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"the dashboard exited: {output.read_text()}")
            found[:] = re.findall(r"dashboard: (http://127\.0\.0\.1:\d+/)", output.read_text())
            return bool(found)

        wait_for(printed_address, START_S, "the dashboard printed its address")
        yield found[0]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(10)


@pytest.fixture(scope="module")
def dashboard(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The dashboard, read-only (actions not enabled)."""
    with serving(cluster.metadata_uri, tmp_path_factory.mktemp("dashboard")) as address:
        yield address


@contextlib.contextmanager
def chromium() -> Iterator[webdriver.Chrome]:
    """Headless Chromium at 1280x800, its chromedriver stopped (by its PID) at the end."""
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.fail(
            "chromium and chromium-driver are not installed; bash scripts/test.sh installs them "
            "(apt-get install chromium chromium-driver)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # as root in a container
        "--disable-dev-shm-usage",
        "--window-size=1280,800",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-component-update",
    ):
        options.add_argument(argument)
    service = webdriver.ChromeService(executable_path=CHROMEDRIVER)
    driver = webdriver.Chrome(options=options, service=service)
    try:
        driver.set_window_size(1280, 800)
        yield driver
    finally:
        try:
            driver.quit()
        finally:
            process = service.process
            if process is not None and process.poll() is None:  # chromedriver, by its PID
                os.kill(process.pid, signal.SIGKILL)
                process.wait(10)


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    with chromium() as driver:
        yield driver


def _open(browser: webdriver.Chrome, address: str, fragment: str = "") -> None:
    browser.get(address + fragment)
    wait_for(
        lambda: bool(browser.find_elements(By.CSS_SELECTOR, "#bookie-table tbody tr")),
        SEEN_S,
        "the page listed bookies",
    )


def _states(browser: webdriver.Chrome) -> dict[str, str]:
    rows = browser.find_elements(By.CSS_SELECTOR, "#bookie-table tbody tr[data-bookie-id]")
    return {
        str(row.get_attribute("data-bookie-id")): str(row.get_attribute("data-state"))
        for row in rows
    }


def _wait_dom(what: str, condition) -> None:  # type: ignore[no-untyped-def]
    """Polls the DOM until ``condition()`` holds (a redraw between two reads of an element
    counts as "not yet")."""

    def holds() -> bool:
        try:
            return bool(condition())
        except WebDriverException:
            return False

    wait_for(holds, SEEN_S, what, interval_s=0.2)


def test_page_lists_the_bookies(
    cluster: LocalCluster, dashboard: str, browser: webdriver.Chrome
) -> None:
    _open(browser, dashboard)
    _wait_dom(
        "the 3 bookies listed as read-write",
        lambda: _states(browser) == dict.fromkeys(cluster.bookie_ids, "read-write"),
    )
    counts = browser.find_element(By.ID, "cluster-counts").text
    assert counts.startswith("3 bookies: 3 read-write")
    # real links and buttons: Tab reaches the skip link first, then the sections' links
    body = browser.find_element(By.TAG_NAME, "body")
    body.send_keys(Keys.TAB)
    assert browser.switch_to.active_element.get_attribute("class") == "skip"
    browser.switch_to.active_element.send_keys(Keys.TAB)
    assert browser.switch_to.active_element.get_attribute("href").endswith("#bookies")


def test_ledger_appears_with_its_ensemble(
    cluster: LocalCluster, dashboard: str, browser: webdriver.Chrome
) -> None:
    with BookKeeper(cluster.metadata_uri) as bk:
        handle = bk.create_ledger(3, 2, 2, password=b"never-shown-password")
        for index in range(20):
            handle.add_entry(f"entry {index}".encode())
        handle.close()
        ledger_id, ensemble = handle.ledger_id, bk.get_ledger_metadata(handle.ledger_id).ensembles
    _open(browser, dashboard)
    row = f'#ledger-table tr[data-ledger-id="{ledger_id}"]'
    _wait_dom(
        f"ledger {ledger_id} listed with its ensemble",
        lambda: all(
            bookie in browser.find_element(By.CSS_SELECTOR, row + " td.ensembles").text
            for bookie in ensemble[0][1]
        ),
    )
    assert browser.find_element(By.CSS_SELECTOR, row + " td:nth-of-type(1)").text == "closed"
    # its page: the fragments as a table of bookies, and entries read back through the client
    browser.find_element(By.CSS_SELECTOR, row + " a").click()
    _wait_dom(
        "the ledger's fragment table",
        lambda: (
            len(browser.find_elements(By.CSS_SELECTOR, "#fragment-table tbody tr")) == 1
            and [
                cell.text for cell in browser.find_elements(By.CSS_SELECTOR, "#fragment-table th")
            ][1:4]
            == sorted(ensemble[0][1])
        ),
    )
    first = browser.find_element(By.ID, "entry-first")
    first.clear()
    first.send_keys("3")
    last = browser.find_element(By.ID, "entry-last")
    last.clear()
    last.send_keys("5" + Keys.ENTER)
    _wait_dom(
        "entries 3 to 5 read",
        lambda: (
            [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#entries pre")]
            == ["entry 3", "entry 4", "entry 5"]
        ),
    )
    assert "never-shown-password" not in browser.page_source


def test_chart_has_points_after_a_write_load(
    cluster: LocalCluster, dashboard: str, browser: webdriver.Chrome
) -> None:
    _open(browser, dashboard)
    with BookKeeper(cluster.metadata_uri) as bk:
        handle = bk.create_ledger(3, 2, 2, password=b"pw")
        deadline = time.monotonic() + 4.0  # a short load: several of the dashboard's polls
        while time.monotonic() < deadline:
            futures = [handle.add_entry_async(b"x" * 512) for _ in range(50)]
            for future in futures:
                future.result()
        handle.close()

    def points(chart: str) -> int:
        return len(browser.find_elements(By.CSS_SELECTOR, f"#{chart} circle.point"))

    _wait_dom(
        "points on both charts", lambda: points("chart-rate") > 2 and points("chart-latency") > 0
    )
    label = browser.find_element(By.ID, "chart-rate").get_attribute("aria-label")
    assert label is not None and label.startswith("adds/s now")


def test_bookie_page_with_its_rack_and_charts(
    cluster: LocalCluster, dashboard: str, browser: webdriver.Chrome
) -> None:
    """A rack set with ``shell bookierack`` shows in the table; the bookie's own page has its
    charts (the points of its scrapes) and its facts."""
    bookie = cluster.bookie_ids[0]
    rack = ["bookierack", "set", bookie, "/dc-1/rack-a", "--metadata-uri", cluster.metadata_uri]
    subprocess.run(
        [sys.executable, "-m", "bookkeeper_py", "shell", *rack],
        check=True,
        capture_output=True,
        timeout=60,
    )
    _open(browser, dashboard)
    row = f'#bookie-table tr[data-bookie-id="{bookie}"]'
    _wait_dom(
        "the rack in the bookie's row",
        lambda: "rack /dc-1/rack-a" in browser.find_element(By.CSS_SELECTOR, row + " th").text,
    )
    browser.find_element(By.CSS_SELECTOR, row + " a.bookie-link").click()
    _wait_dom(
        "the bookie's page, the focus on its title",
        lambda: (
            browser.find_element(By.ID, "bookie").is_displayed()
            and browser.switch_to.active_element.get_attribute("id") == "bookie-title"
        ),
    )
    _wait_dom(
        "its facts and a chart with points",
        lambda: (
            "/dc-1/rack-a" in browser.find_element(By.ID, "bookie-facts").text
            and len(browser.find_elements(By.CSS_SELECTOR, "#bookie-chart-rate circle.point")) > 1
        ),
    )
    assert browser.find_element(By.ID, "bookie-title").text == f"Bookie {bookie}"
    browser.find_element(By.CSS_SELECTOR, '#bookie a[href="#bookies"]').click()
    _wait_dom(
        "the bookie page hidden again",
        lambda: not browser.find_element(By.ID, "bookie").is_displayed(),
    )


def test_action_refused_without_enabling(
    cluster: LocalCluster, dashboard: str, browser: webdriver.Chrome
) -> None:
    _open(browser, dashboard)
    bookie = cluster.bookie_ids[0]
    button = f'#bookie-table tr[data-bookie-id="{bookie}"] button.set-readonly'
    _wait_dom("the read-only button", lambda: browser.find_element(By.CSS_SELECTOR, button))
    browser.find_element(By.CSS_SELECTOR, button).click()
    _wait_dom(
        "the confirmation dialog", lambda: browser.find_element(By.ID, "confirm").is_displayed()
    )
    assert bookie in browser.find_element(By.ID, "confirm-text").text
    browser.find_element(By.ID, "confirm-ok").click()
    _wait_dom(
        "the page saying the action was refused",
        lambda: "Refused (403)" in browser.find_element(By.ID, "alert").text,
    )
    assert "--enable-actions" in browser.find_element(By.ID, "alert").text
    with MetadataClient.connect(cluster.metadata_uri) as metadata:
        assert bookie in metadata.writable_bookies()


def test_screenshots(
    cluster: LocalCluster, dashboard: str, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    browser.set_window_size(1280, 800)
    _open(browser, dashboard)
    _wait_dom("3 bookies", lambda: len(_states(browser)) == 3)
    wide = tmp_path / "dashboard-1280x800.png"
    assert browser.save_screenshot(str(wide))
    print(f"screenshot of the dashboard at 1280x800: {wide}")
    try:
        browser.set_window_size(420, 800)
        _wait_dom(
            "the narrow layout (charts one above the other, nothing wider than the screen)",
            lambda: browser.execute_script(
                "return document.documentElement.scrollWidth <= document.documentElement.clientWidth"
            ),
        )
        narrow = tmp_path / "dashboard-narrow.png"
        assert browser.save_screenshot(str(narrow))
        print(f"screenshot of the dashboard on a narrow screen: {narrow}")
    finally:
        browser.set_window_size(1280, 800)


def test_killed_bookie_shows_as_down(
    cluster: LocalCluster, dashboard: str, browser: webdriver.Chrome
) -> None:
    _open(browser, dashboard)
    victim = cluster.bookie_ids[2]
    _wait_dom("the bookie up first", lambda: _states(browser).get(victim) == "read-write")
    cluster.kill_bookie(2)
    try:
        _wait_dom(f"bookie {victim} shown as down", lambda: _states(browser).get(victim) == "down")
        others = {b: s for b, s in _states(browser).items() if b != victim}
        assert set(others.values()) == {"read-write"}
    finally:
        cluster.start_bookie(2)


@pytest.mark.parametrize("flags", [[], ["--no-dashboard"]])
def test_localbookie_serves_the_dashboard(flags: list[str]) -> None:
    """``localbookie`` starts a dashboard and prints its address (not with --no-dashboard)."""
    process = subprocess.run(
        [sys.executable, "-m", "bookkeeper_py", "localbookie", "1", "--exit-after-demo", *flags],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert process.returncode == 0, process.stderr
    printed = re.findall(r"^dashboard: http://127\.0\.0\.1:\d+/$", process.stdout, re.MULTILINE)
    assert len(printed) == (0 if flags else 1), process.stdout
