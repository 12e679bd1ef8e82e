"""Headless Chromium for the tests that open pages (Debian's ``chromium`` and ``chromium-driver``,
installed by ``scripts/setup.sh``), driven by Selenium."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def chromium(width: int = 1280, height: int = 1600) -> Iterator[Any]:
    """A headless Chromium WebDriver that records the browser console (``get_log("browser")``)."""
    from selenium import webdriver

    from tests.conftest import require_mark

    require_mark("browser", "opens headless Chromium")
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    assert binary and driver_path, "chromium and chromedriver are missing: run ./scripts/setup.sh"
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", f"--window-size={width},{height}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def open_page(driver: Any, uri: str, ready_js: str, timeout_s: float = 60.0) -> None:
    """Open ``uri`` and wait until the page's own script says it has finished (``ready_js``, a
    JavaScript expression, is true). Past ``timeout_s`` seconds the failure carries the browser's
    console, so that a script that stopped half way names its error."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(uri)
    try:
        WebDriverWait(driver, timeout_s, poll_frequency=0.2).until(lambda d: d.execute_script(f"return Boolean({ready_js});"))
    except TimeoutException:
        log = [entry.get("message", "") for entry in driver.get_log("browser")]
        state = driver.execute_script("return document.readyState;")
        raise AssertionError(f"{uri}: the page was not ready after {timeout_s:.0f} s ({ready_js}); "
                             f"document.readyState={state!r}; browser console: {log}") from None
