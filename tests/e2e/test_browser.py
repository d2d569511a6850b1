"""The browser UI in Debian's chromium, headless, driven by Playwright: attach, ask, stream, Stop."""

import os
import time

import pytest

from tests.app.live import wait_until
from tests.e2e.conftest import BROWSER_ARGS, CHROMIUM
from vlchat.app.model_choice import EXAMPLES

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium (apt-get install chromium)"),
]


def test_attach_ask_stream_and_stop(ui_server, long_engine, tmp_path):
    from playwright.sync_api import sync_playwright

    baseline = long_engine.num_free_blocks()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.goto(ui_server.url)
            page.wait_for_selector("#prompt textarea")
            assert "tiny-llava" in page.inner_text("#model-name") and "untrained" in page.inner_text("#model-name")

            page.get_by_text("Generation settings", exact=True).click()
            max_new = page.get_by_label("number input for Max new tokens")
            max_new.fill("4000")
            max_new.press("Enter")
            page.locator("#prompt input[type=file]").set_input_files(str(EXAMPLES / "two-shapes.png"))
            page.wait_for_selector("#prompt img")  # the thumbnail of the attached image
            page.locator("#prompt textarea").fill("What is in this picture?")
            page.locator("#prompt textarea").press("Enter")

            bot = page.locator("#chatbot .message.bot").last
            page.wait_for_selector("#chatbot .message.user img")  # our image is in the conversation
            first = wait_until(lambda: bot.count() and bot.inner_text().strip(), 30, "the first tokens")
            later = wait_until(lambda: len(bot.inner_text().strip()) > len(first) and bot.inner_text(), 10, "more")
            assert long_engine.num_free_blocks() < baseline  # generating: the request holds KV blocks
            page.locator("#prompt .stop-button").click()

            page.wait_for_selector("#prompt .submit-button", timeout=10_000)
            stopped = bot.inner_text()
            time.sleep(0.5)
            assert bot.inner_text() == stopped and len(stopped) >= len(later)  # nothing more arrives
            wait_until(lambda: long_engine.num_free_blocks() == baseline, 10, "the KV blocks to come back")
            assert len(stopped) < 4000  # it ended early, not at max new tokens
            page.screenshot(path=str(tmp_path / "ui.png"))
        finally:
            browser.close()
