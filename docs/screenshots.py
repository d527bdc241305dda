"""Take the pictures under docs/: the dashboard of a local cluster with two workers and three
busy sessions (docs/dashboard.png), and a sharded tensor's notebook view (docs/sharded_repr.png).

Run it from the checkout with the test extra installed and Debian's chromium and
chromium-driver: ``.venv/bin/python docs/screenshots.py``. It uses the browser test's own
machinery (tests/browser.py) and takes about half a minute.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent / "tests"))

from browser import chromium_missing, headless_chromium  # noqa: E402
from polling import wait_for  # noqa: E402

import fabric  # noqa: E402
from fabric.client.dashboard import dashboard_address, sign_in_link  # noqa: E402

BUSY_SECONDS = 40.0  # of work before the picture: the plots (a minute wide) fill two thirds


def busy(sessions: list[fabric.Session], seconds: float) -> None:
    """Uploads and ops of changing sizes on each session, so every plot has a shape."""
    held: list[list[object]] = [[] for _ in sessions]
    rng = np.random.default_rng(7)
    end = time.monotonic() + seconds
    step = 0
    while time.monotonic() < end:
        for kept, session in zip(held, sessions):
            a = session.asarray(rng.random(int(rng.integers(1, 4)) << 18))
            for _ in range(int(rng.integers(5, 40))):
                a = np.sin(a) * 2 + 1
            kept.append(a)
            if len(kept) > 6 + (step // 10) % 6:
                del kept[: len(kept) // 2]
            session.sync()
        step += 1
        time.sleep(0.15)


def main() -> None:
    missing = chromium_missing()
    if missing is not None:
        sys.exit(f"docs/screenshots.py needs Chromium: {missing}")
    with fabric.LocalCluster(workers=2, devices_per_worker=2,
                             broker_args=("--metrics", "127.0.0.1:0")) as cluster, \
            headless_chromium(width=1280, height=760) as driver:
        sessions = [cluster.connect(device=d) for d in (0, 1, 3)]
        try:
            driver.get(sign_in_link(dashboard_address(cluster.metrics_url),
                                    cluster.admin_token))
            wait_for(lambda: len(driver.find_elements("css selector", "#sessions tbody tr"))
                     == 3, 20, "the three sessions on the page")
            busy(sessions, BUSY_SECONDS)
            driver.save_screenshot(str(DOCS / "dashboard.png"))
            mesh = sessions[0].mesh()
            x = mesh.asarray(np.random.randn(1000, 800), axis=0)
            with tempfile.TemporaryDirectory() as folder:
                page = Path(folder) / "repr.html"
                page.write_text("<!doctype html><meta charset=utf-8>"
                                "<body style='margin:12px;font:14px sans-serif'>"
                                f"<div id=repr style='display:inline-block'>{x._repr_html_()}"
                                "</div>")
                driver.get(page.as_uri())
                driver.find_element("id", "repr").screenshot(str(DOCS / "sharded_repr.png"))
            mesh.close()
        finally:
            for session in sessions:
                session.close()
    for name in ("dashboard.png", "sharded_repr.png"):
        print(f"docs/{name}: {(DOCS / name).stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
