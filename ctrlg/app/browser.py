"""Headless Chromium for the editor's end-to-end test and its screenshot: Debian's ``chromium``
and ``chromedriver`` (``apt-get install chromium chromium-driver``) driven by Selenium.

Nothing is downloaded: the browser and driver paths are given explicitly, so Selenium Manager is
never consulted. Flags keep the browser offline and quiet (no sync, component updates or
background networking) and use a fresh profile directory."""

from __future__ import annotations

import os
import shutil

__all__ = ["CHROMIUM_FLAGS", "find_chromium", "headless_chromium"]

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--disable-dev-shm-usage")


def find_chromium() -> tuple[str, str] | None:
    """``(browser, driver)`` paths ($CHROMIUM / $CHROMEDRIVER or on PATH), or None."""
    browser = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    driver = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def headless_chromium(user_data_dir: str, width: int = 1400, height: int = 900):
    """A Selenium Chrome WebDriver on the system Chromium with a fresh profile in ``user_data_dir``."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    found = find_chromium()
    if found is None:
        raise RuntimeError("no chromium/chromedriver found: apt-get install -y chromium chromium-driver")
    browser, driver = found
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={user_data_dir}")
    options.add_argument(f"--window-size={width},{height}")
    return webdriver.Chrome(options=options, service=Service(executable_path=driver))
