"""A whole chat in headless chromium over the demo model: several images, edits, a refused turn, reload.

Greedy answers of the demo model about the example images are known, so every step checks what the
chat shows. Each step is a reproduction from issue 46.
"""

import os

import pytest

from tests.app.live import wait_until
from tests.e2e.conftest import BROWSER_ARGS, CHROMIUM
from vlchat.app.model_choice import EXAMPLES

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium (apt-get install chromium)"),
]

ONE, TWO_CIRCLES, THREE = (str(EXAMPLES / n) for n in ("one-shape.png", "two-circles.png", "three-shapes.png"))


@pytest.fixture
def page(demo_server):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        context = browser.new_context(viewport={"width": 1200, "height": 900})
        page = context.new_page()
        errors = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(demo_server.url)
        page.wait_for_selector("#prompt textarea")
        greedy(page)
        yield page
        assert not errors, errors  # no exception in the page's scripts (the image edit used to throw one)
        browser.close()


def greedy(page):
    page.get_by_text("Generation settings", exact=True).click()
    temperature = page.get_by_label("number input for Temperature")
    temperature.fill("0")
    temperature.press("Enter")
    page.get_by_text("Generation settings", exact=True).click()


def idle(page):
    page.wait_for_selector("#prompt .submit-button", timeout=60_000)
    page.wait_for_function("!document.querySelector('#prompt textarea').disabled", timeout=10_000)


def send(page, text, files=(), refused=False):
    if files:
        page.locator("#prompt input[type=file]").set_input_files(list(files))
        wait_until(lambda: page.locator("#prompt img").count() >= len(files), 10, "the thumbnails")
    page.locator("#prompt textarea").fill(text)
    page.locator("#prompt textarea").press("Enter")
    if not refused:  # an accepted turn empties the box when it starts
        wait_until(lambda: page.locator("#prompt textarea").input_value() == "", 20, "the turn to start")


def bot_texts(page):
    return page.eval_on_selector_all("#chatbot .message.bot", "els => els.map(e => e.innerText.trim())")


def shown(texts):
    return all(t and t != "Loading content" for t in texts)


def answered(page, count):
    idle(page)
    return wait_until(lambda: len(texts := bot_texts(page)) == count and shown(texts) and texts, 30, "answers")


def edit_user_message(page, nth_text_message, new_text):
    """Press Edit on the nth user message that shows text, replace the text, submit."""
    page.locator("#chatbot").get_by_label("Edit").nth(nth_text_message).click()  # only text messages have one
    box = page.locator("#chatbot textarea.edit-textarea")
    box.fill(new_text)
    page.locator("#chatbot").get_by_label("Submit").click()


def test_images_edits_refused_turn_and_reload(page, demo_server, tmp_path):
    # Two images in one message: both are shown in the chat and reach the model.
    send(page, "How many shapes are there?", [ONE, TWO_CIRCLES])
    answer = answered(page, 1)[0]
    assert page.locator("#chatbot .message.user img").count() == 2
    # the demo model answers about each image (docs/DEMO_MODEL.md)
    assert answer == "In the first image, there is one shape. In the second image, there are two shapes.", answer

    # A follow-up without an image, then an edit of that text message: the new answer replaces the old one.
    send(page, "What shapes are in the image?")
    first = answered(page, 2)
    edit_user_message(page, 1, "How many shapes are there?")
    wait_until(lambda: len(t := bot_texts(page)) == 2 and shown(t) and t[1] != first[1], 30, "the edited answer")
    idle(page)
    assert bot_texts(page) == [answer, answer]  # the same question about the same two images

    # Edit the message that came with the images: its images stay, the later turn goes.
    edit_user_message(page, 0, "Describe the images.")
    wait_until(lambda: len(t := bot_texts(page)) == 1 and t[0].startswith("The first image shows") and
               "The second image shows" in t[0], 30, "image edit answer")  # fmt: skip
    idle(page)
    assert page.locator("#chatbot .message.user img").count() == 2

    # An unreadable image: a warning, nothing enters the chat, the text stays in the box.
    page.locator("#new-chat").click()
    wait_until(lambda: not bot_texts(page), 10, "an empty chat")
    fake = tmp_path / "broken.png"
    fake.write_bytes(b"these bytes are not a picture")
    send(page, "How many shapes are there?", [str(fake)], refused=True)
    page.get_by_text("not a readable image").first.wait_for(timeout=20_000)
    idle(page)
    assert page.locator("#chatbot .message").count() == 0
    assert page.locator("#prompt textarea").input_value() == "How many shapes are there?"
    page.locator("#prompt").get_by_label("Remove").first.click()  # drop the broken file, keep the text
    page.locator("#prompt input[type=file]").set_input_files([THREE])
    wait_until(lambda: page.locator("#prompt img").count() == 1, 10, "the thumbnail")
    send(page, "How many shapes are there?")
    assert answered(page, 1) == ["There are three shapes."]

    # Reload: both chats are in the sidebar, and the newest one is open again.
    page.reload()
    page.wait_for_selector("#prompt textarea")
    chats = page.locator("#chat-list label")
    wait_until(lambda: chats.count() == 2, 20, "two saved chats")
    assert "three shapes" in " ".join(bot_texts(page))
    chats.nth(1).click()  # the older chat, with its two images
    wait_until(lambda: page.locator("#chatbot .message.user img").count() == 2, 20, "the older chat")
    assert bot_texts(page)[0].startswith("The first image shows")


CODE_CHAT = {
    "title": "Code sample",
    "messages": [
        {"role": "user", "content": "Show me a loop."},
        {"role": "assistant", "content": "Here:\n\n```python\nfor i in range(3):\n    print(i)\n```\n\nDone."},
    ],
}


def test_import_rename_export_delete_and_rendering(demo_server, tmp_path):
    import json

    from playwright.sync_api import sync_playwright

    source = tmp_path / "code.json"
    source.write_text(json.dumps(CODE_CHAT))
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1200, "height": 900}, color_scheme="dark",
                                          accept_downloads=True)  # fmt: skip
            page = context.new_page()
            page.goto(demo_server.url)
            page.wait_for_selector("#prompt textarea")
            assert page.evaluate("document.body.classList.contains('dark')")  # dark mode follows the system

            with page.expect_file_chooser() as chooser:
                page.locator("#import-chat").click()
            chooser.value.set_files(str(source))
            chats = page.locator("#chat-list label")
            wait_until(lambda: chats.count() == 1 and "Code sample" in chats.first.inner_text(), 20, "the import")
            code = page.locator("#chatbot .message.bot pre code")
            code.first.wait_for(timeout=10_000)
            assert "print(i)" in code.first.inner_text()
            assert code.first.locator("span.token").count() >= 3  # highlighted, not plain text
            assert page.locator("#chatbot .message-buttons").get_by_label("Copy message").count() >= 1

            page.locator("#rename textarea, #rename input").first.fill("Loops")
            page.locator("#rename textarea, #rename input").first.press("Enter")
            wait_until(lambda: chats.first.inner_text().strip() == "Loops", 10, "the new name")

            with page.expect_download() as download:
                page.locator("#export-chat").click()
            exported = json.loads(open(download.value.path()).read())
            assert exported == {"title": "Loops", "messages": CODE_CHAT["messages"]}

            page.reload()
            page.wait_for_selector("#prompt textarea")
            wait_until(lambda: chats.count() == 1 and chats.first.inner_text().strip() == "Loops", 20, "after reload")
            page.locator("#delete-chat").click()
            wait_until(lambda: chats.count() == 0, 10, "the deletion")
            page.reload()
            page.wait_for_selector("#prompt textarea")
            page.wait_for_timeout(1000)
            assert chats.count() == 0
        finally:
            browser.close()
