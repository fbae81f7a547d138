"""The job page in a real headless browser (Debian's chromium through chromedriver and
Selenium): three agents on 127.0.0.1-3, one computing twice as long; the page served at
``/`` of one agent shows three node rows and draws a series per node, the slow node's the
highest and its row marked. A screenshot is saved (``TEST_AGENTD_PAGE_SCREENSHOT`` names where;
docs/img/job-page.png is one)."""

from __future__ import annotations

import os
import shutil
import urllib.request

import pytest

from agentd.jobview.web import FILES, PAGE
from tests.conftest import wait_until
from tests.jobview.test_job_view import stop_all, three_nodes

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1100",
)


SNAPSHOT = """
const rows = [...document.querySelectorAll('#nodes tbody tr')]
    .map((tr) => [tr.dataset.host, tr.className]);
const lines = [...document.querySelectorAll('#steps polyline')].map((line) => [
    line.dataset.host, (line.getAttribute('points') || '').split(' ').length,
    Number(line.dataset.last)]);
return {rows, lines};
"""
"""The rows (host, class) and the series (host, points, last value) as drawn now."""


@pytest.fixture
def browser(tmp_path):
    webdriver = pytest.importorskip("selenium.webdriver")
    if not (os.path.exists(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        if os.environ.get("CI"):
            pytest.fail("chromium and chromium-driver are missing: .ci/run installs them")
        pytest.skip("needs Debian's chromium and chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def test_the_page_ships_small_and_offline():
    total = sum((PAGE / name).stat().st_size for name in FILES)
    assert total <= 200 * 1024
    for name in FILES:
        text = (PAGE / name).read_text()
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")
        assert "https://" not in text  # nothing fetched from elsewhere


def test_the_page_shows_every_node_and_the_slow_one_stands_out(
    browser, run_agentd, run_store, tmp_path
):
    from selenium.webdriver.common.by import By

    agents, url, stop = three_nodes(run_agentd, run_store, tmp_path)
    with urllib.request.urlopen(url + "/", timeout=5) as answer:
        assert "script-src 'self'" in answer.headers["Content-Security-Policy"]
    browser.get(url + "/")

    def drawn() -> dict | None:  # one snapshot: the page redraws every 2 s
        page = browser.execute_script(SNAPSHOT)
        lines = page["lines"]
        done = len(page["rows"]) == 3 and len(lines) == 3 and min(n for _, n, _ in lines) >= 3
        return page if done and [c for _, c in page["rows"]].count("slow") == 1 else None

    page = wait_until(drawn, 60, what="three node rows, three series drawn, one slow row")
    assert [host for host, c in page["rows"] if c == "slow"] == ["127.0.0.3"]
    assert max(page["lines"], key=lambda line: line[2])[0] == "127.0.0.3"
    summary = browser.find_element(By.ID, "summary").text
    assert "nodes 3 (3:3)" in summary and "world size 6" in summary
    assert browser.find_element(By.ID, "problem").get_attribute("hidden") is not None
    shot = os.environ.get("TEST_AGENTD_PAGE_SCREENSHOT") or str(tmp_path / "job-page.png")
    assert browser.save_screenshot(shot)
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
    stop_all(agents, stop)  # the agent's exit waited for the page to be shown the end
    ended = browser.find_element(By.ID, "ended").text
    assert ended == "The run of this agent ended: SUCCEEDED. The view stays as it was last read."
