"""The UI's chat endpoint driven by gradio_client, as a script would: text and an uploaded image."""

from gradio_client import Client, handle_file

from app.model_choice import EXAMPLES


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
