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
