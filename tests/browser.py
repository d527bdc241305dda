"""A headless Chromium for the dashboard's test and docs/screenshots.py: Debian's chromium
(and its chromedriver) driven by selenium.

Rule: nothing is downloaded: the browser and its driver are the system's (``.ci/run``
installs them where missing), named to selenium so that its manager never looks for others;
where either is missing, ``chromium_missing`` says so in a sentence the tests skip with.
"""

from __future__ import annotations

import importlib.util
import shutil
from contextlib import contextmanager
from typing import Any, Iterator

BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome")
INSTALL_HINT = "apt-get install chromium chromium-driver (as .ci/run does, as root)"


def _browser() -> str | None:
    return next(filter(None, map(shutil.which, BROWSER_NAMES)), None)


def chromium_missing() -> str | None:
    """Why no headless Chromium can run here, in a sentence; None where one can."""
    if importlib.util.find_spec("selenium") is None:  # (the test extra's)
        return "selenium is not installed: pip install -e '.[test]'"
    if _browser() is None:
        return f"no Chromium found on PATH: {INSTALL_HINT}"
    if shutil.which("chromedriver") is None:
        return f"no chromedriver found on PATH: {INSTALL_HINT}"
    return None


@contextmanager
def headless_chromium(width: int = 1400, height: int = 900) -> Iterator[Any]:
    """A selenium WebDriver over a headless Chromium ``width`` x ``height`` CSS pixels; both
    processes end when the block does."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = _browser()
    for argument in ("--headless=new", "--no-sandbox",  # (root in CI: no user namespaces)
                     "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                     "--disable-extensions", "--disable-background-networking",
                     f"--window-size={width},{height}", "--force-device-scale-factor=1"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options,
                              service=Service(executable_path=shutil.which("chromedriver")))
    try:
        driver.set_page_load_timeout(20)
        driver.set_script_timeout(20)
        yield driver
    finally:
        driver.quit()
