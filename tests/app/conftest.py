"""One engine and a few live servers for the app tests (session-scoped: the model loads once)."""

import pytest

from tests.app.live import start_engine, start_server
from tests.vision.tiny_vlm import make_tiny_llava
from vlchat.app.model_choice import EXAMPLES, ModelChoice

API_KEY = "test-key-123"
BODY_LIMIT = 300_000
LONG_CONTEXT = 4096


@pytest.fixture(scope="session")
def tiny_engine(tmp_path_factory):
    # 4096 positions (the config says 512; RoPE runs past it), so that an unstopped answer runs for seconds
    engine = start_engine(
        make_tiny_llava(tmp_path_factory.mktemp("models")), max_model_len=LONG_CONTEXT, num_blocks=320
    )
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def tiny_choice(tiny_engine):
    return ModelChoice(tiny_engine.config.model, "tiny-llava", untrained=True, example_dirs=[EXAMPLES])


@pytest.fixture(scope="session")
def server(tiny_engine, tiny_choice):
    """The whole app (UI + API) over the tiny random LLaVA, no protection."""
    server = start_server(tiny_engine, tiny_choice)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def media_root(tmp_path_factory):
    return tmp_path_factory.mktemp("media")


@pytest.fixture(scope="session")
def locked_server(tiny_engine, tiny_choice, media_root):
    """API only, with an API key, a local media directory and a small body limit."""
    from vlchat.app.settings import MediaLimits

    media = MediaLimits(allowed_local_dir=str(media_root), max_images_per_request=2)
    server = start_server(
        tiny_engine, tiny_choice, with_ui=False, api_key=API_KEY, media=media, max_request_bytes=BODY_LIMIT
    )
    yield server
    server.stop()
