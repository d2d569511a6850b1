"""The UI's chat endpoint driven by gradio_client, as a script would: text and an uploaded image."""

from gradio_client import Client, handle_file

from vlchat.app.model_choice import EXAMPLES


def test_gradio_client_chat_with_image(server):
    client = Client(server.url, verbose=False)
    try:
        settings = ("", 0.0, 0.95, 8)  # system prompt, temperature, top-p, max new tokens
        text = client.predict({"text": "What is this?", "files": []}, *settings, api_name="/chat")
        assert isinstance(text, str) and text
        image = {"text": "What is this?", "files": [handle_file(str(EXAMPLES / "one-shape.png"))]}
        with_image = client.predict(image, *settings, api_name="/chat")
        assert isinstance(with_image, str) and with_image and with_image != text
    finally:
        client.close()


def test_ui_api_refuses_server_paths_that_were_not_uploaded(server, tmp_path):
    import httpx

    secret = tmp_path / "secret.png"
    secret.write_bytes((EXAMPLES / "one-shape.png").read_bytes())
    message = {"text": "hi", "files": [{"path": str(secret), "meta": {"_type": "gradio.FileData"}}]}
    call = httpx.post(f"{server.url}/gradio_api/call/chat", json={"data": [message, "", 0.0, 1.0, 4, []]})
    assert call.status_code == 403 and "uploaded" in call.json()["error"]["message"]  # app/ui_file_guard.py


def test_auth_protects_the_ui(tiny_engine, tiny_choice):
    import httpx

    from tests.app.live import start_server

    server = start_server(tiny_engine, tiny_choice, auth=("ann", "s3cret"))
    try:
        message = {"text": "What is this?", "files": []}
        refused = httpx.post(f"{server.url}/gradio_api/call/chat", json={"data": [message, "", 0.0, 1.0, 4, []]})
        assert refused.status_code == 401
        client = Client(server.url, auth=("ann", "s3cret"), verbose=False)
        try:
            assert client.predict(message, "", 0.0, 0.95, 4, api_name="/chat")
        finally:
            client.close()
        assert httpx.get(f"{server.url}/health").status_code == 200  # health and /v1 are not behind the UI login
    finally:
        server.stop()


def test_uploads_are_deleted_when_the_server_stops(tiny_engine, tiny_choice):
    import os

    import httpx

    from tests.app.live import start_server

    server = start_server(tiny_engine, tiny_choice)
    try:
        files = {"files": ("photo.png", (EXAMPLES / "one-shape.png").read_bytes(), "image/png")}
        (uploaded,) = httpx.post(f"{server.url}/gradio_api/upload", files=files).json()
        message = {"text": "What is this?", "files": [{"path": uploaded, "meta": {"_type": "gradio.FileData"}}]}
        call = httpx.post(f"{server.url}/gradio_api/call/chat", json={"data": [message, "", 0.0, 1.0, 4, []]})
        assert "event: complete" in httpx.get(f"{server.url}/gradio_api/call/chat/{call.json()['event_id']}").text
        assert os.path.exists(uploaded)
    finally:
        server.stop()
    assert not os.path.exists(uploaded)


def test_browser_sessions_are_batched_together(server, tiny_engine):
    import threading
    import time

    peak, done = [0], threading.Event()

    def watch():  # how many requests the engine holds at once
        while not done.is_set():
            peak[0] = max(peak[0], len(tiny_engine.engine.requests))
            time.sleep(0.001)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    client = Client(server.url, verbose=False)
    try:
        messages = [{"text": f"What is this? {i}", "files": []} for i in range(3)]
        jobs = [client.submit(m, "", 0.0, 1.0, 100, api_name="/chat") for m in messages]
        assert all(job.result(timeout=60) for job in jobs)
        assert peak[0] >= 2  # a second chat does not wait for the first one's answer (Gradio's default would)
    finally:
        done.set()
        client.close()


def test_a_reused_client_starts_a_new_conversation_each_call(demo_server):
    from vlchat.app.client import image_url

    greedy = ("", 0.0, 0.95, 40)
    count = "How many shapes are there?"
    client = Client(demo_server.url, verbose=False)
    try:
        image = {"text": count, "files": [handle_file(str(EXAMPLES / "one-shape.png"))]}
        assert client.predict(image, *greedy, api_name="/chat") == "There is one shape."
        # the same client, no image: this conversation has none, so the demo model says what it can do
        text_only = client.predict({"text": count, "files": []}, *greedy, api_name="/chat")
        assert "one shape" not in text_only and text_only.startswith("Hello! I am a small demo model")
        # earlier turns come only through `history` (OpenAI messages, images as data: URLs)
        history = [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_url(EXAMPLES / "one-shape.png")}},
                                         {"type": "text", "text": "What shapes are in the image?"}]},
            {"role": "assistant", "content": "I see a blue circle."},
        ]  # fmt: skip
        follow_up = client.predict({"text": count, "files": []}, *greedy, history, api_name="/chat")
        assert follow_up == "There is one shape."
    finally:
        client.close()
