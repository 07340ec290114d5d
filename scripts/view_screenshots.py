"""Screenshots of the viewer's main pages for the docs (docs/img/view_*.png), in headless Chromium.

    python scripts/view_screenshots.py --database-url sqlite:///.dressage/dressage.db --run quickstart \\
        [--session SID] [--out docs/img]

Serves the viewer on a free loopback port over the given log (read-only), opens the run page, a
session page (the given one, else the run's first finished session), a group page and the training
page, and writes one PNG per page (the top 1400x1100 pixels, or the session's segments and tokens).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from urllib.parse import urlencode

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dressage.config import Settings
from dressage.view.app import create_app
from dressage.view.readonly import open_readonly_store
from dressage.view.server import ViewServer
from tests.loopback import ThreadedServer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--database-url", required=True)
    p.add_argument("--home", default=".dressage", help="DRESSAGE_HOME of the log (artifacts)")
    p.add_argument("--run", required=True)
    p.add_argument("--session", help="session to show (default: the run's first finished one)")
    p.add_argument("--out", default="docs/img")
    a = p.parse_args()
    store = open_readonly_store(Settings(database_url=a.database_url, home=Path(a.home)))
    session = a.session or store.list_sessions(a.run, status="finished")[0].id
    app = create_app(store)
    server = ThreadedServer(app, server=lambda config: ViewServer(config, app.state.live))
    server.start()
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1100"):
        options.add_argument(arg)
    options.binary_location = "/usr/bin/chromium"
    driver = webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
    pages = {
        "view_run": "/run?" + urlencode({"name": a.run}),
        "view_session": "/session?" + urlencode({"id": session}),
        "view_group": "/group?" + urlencode({"run": a.run, "group": 0}),
        "view_training": "/training?" + urlencode({"run": a.run}),
    }
    try:
        for name, path in pages.items():
            driver.get(server.base + path)
            time.sleep(1.0)
            if name == "view_session":  # the token view draws its turns as they come near: all now
                driver.execute_script("document.getElementById('tokens-all').click()")
                driver.execute_script("document.querySelector('h2').scrollIntoView()")
                time.sleep(0.3)
            out = Path(a.out) / f"{name}.png"
            driver.save_screenshot(str(out))
            print(f"wrote {out}")
    finally:
        driver.quit()
        server.stop()
        store.close()


if __name__ == "__main__":
    main()
