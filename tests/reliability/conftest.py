"""Engines and live servers for the reliability tests (session-scoped: each model loads once).

Text cases run on a tiny random Llama (tests/llm/tiny.py), image cases on the demo model in
assets/demo-model (a small LLaVA) behind the same server configuration: an API key, an allowed
local media directory, at most 2 images per request and a small body limit.
"""

from __future__ import annotations

import pytest

from tests.app.live import start_engine, start_server
from tests.llm.tiny import make_tiny_llama
from vlchat.app.model_choice import DEMO_MODEL, EXAMPLES, ModelChoice
from vlchat.app.settings import MediaLimits

API_KEY = "reliability-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
BODY_LIMIT = 200_000
MAX_IMAGES = 2
TEXT_MODEL_LEN = 256
TEXT_BLOCKS = 512  # 16-token blocks: room for 128 short streams at once


@pytest.fixture(scope="session")
def text_model_dir(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("reliability-llama"))


@pytest.fixture(scope="session")
def text_engine(text_model_dir):
    engine = start_engine(
        text_model_dir, dtype="float32", device="cpu", max_model_len=TEXT_MODEL_LEN, num_blocks=TEXT_BLOCKS,
        max_num_seqs=128,
    )  # fmt: skip
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def vlm_engine():
    engine = start_engine(DEMO_MODEL, num_blocks=128)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def media_root(tmp_path_factory):
    return tmp_path_factory.mktemp("allowed-media")


def _locked(engine, name: str, media_root):
    media = MediaLimits(allowed_local_dir=str(media_root), max_images_per_request=MAX_IMAGES)
    choice = ModelChoice(engine.config.model, name, untrained=True, example_dirs=[EXAMPLES])
    return start_server(engine, choice, with_ui=False, api_key=API_KEY, media=media, max_request_bytes=BODY_LIMIT)


@pytest.fixture(scope="session")
def text_server(text_engine, media_root):
    """The API over the tiny Llama, with an API key, a media directory and limits."""
    server = _locked(text_engine, "tiny-llama", media_root)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def vlm_server(vlm_engine, media_root):
    """The API over the demo LLaVA model, configured like `text_server`."""
    server = _locked(vlm_engine, "vlchat-demo", media_root)
    yield server
    server.stop()
