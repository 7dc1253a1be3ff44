"""A headless Chromium for the web pages' tests: the system's chromium and chromedriver, driven by Selenium.

Nothing is downloaded: without the system packages (Debian: chromium, chromium-driver; `make test` installs
them when it runs as root with apt) or without selenium, the browser tests skip and say why.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


def find_browser() -> tuple[str, str] | str:
    """(chromium, chromedriver) paths, or the reason the browser tests cannot run."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        return "no chromium + chromedriver on this machine (Debian: apt-get install chromium chromium-driver)"
    return chromium, driver


def start_browser(width: int = 1280, height: int = 900):
    found = find_browser()
    if isinstance(found, str):
        pytest.skip(found)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver_path = found
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",  # as root in a container, the sandbox cannot start
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-extensions",
        "--no-first-run",
        f"--window-size={width},{height}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver_path), options=options)


def console_errors(driver) -> list[str]:
    """Severe console messages since the last call (script errors, Content-Security-Policy violations)."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def screenshot(driver, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(path))
    return path
