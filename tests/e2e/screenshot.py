"""Regenerate docs/screenshot-ui.png: the demo model describing two images sent in one message.

    python -m tests.e2e.screenshot

Not a test: it serves assets/demo-model, sends two images in one message in headless chromium,
then a follow-up about one of them (greedy answers), and saves the page, saved chat in the sidebar,
once the answers are complete.
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.app.live import demo_choice, start_engine, start_server
from tests.e2e.conftest import BROWSER_ARGS, CHROMIUM
from tests.e2e.test_chat_walk import ONE, TWO_CIRCLES, answered, greedy, send

OUT = Path(__file__).resolve().parents[2] / "docs" / "screenshot-ui.png"


def main(out: Path = OUT) -> None:
    from playwright.sync_api import sync_playwright

    choice = demo_choice()
    engine = start_engine(choice.path, max_model_len=1024)
    server = start_server(engine, choice)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.goto(server.url)
            page.wait_for_selector("#prompt textarea")
            greedy(page)
            send(page, "Describe the images.", [ONE, TWO_CIRCLES])
            answered(page, 1)
            send(page, "How many shapes are in the second image?")
            answered(page, 2)
            time.sleep(0.5)
            page.screenshot(path=str(out))
            browser.close()
    finally:
        server.stop()
        engine.shutdown()
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
