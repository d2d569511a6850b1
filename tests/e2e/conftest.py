"""A live app over a tiny random LLaVA whose context is long enough that an answer runs for seconds."""

import pytest

from tests.app.live import start_engine, start_server
from tests.vision.tiny_vlm import make_tiny_llava
from vlchat.app.model_choice import EXAMPLES, ModelChoice

BROWSER_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-quic",
]  # fmt: skip
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="session")
def long_engine(tmp_path_factory):
    # 4096 positions (the config says 512; RoPE runs past it): an unstopped answer takes many seconds on CPU
    engine = start_engine(make_tiny_llava(tmp_path_factory.mktemp("models")), max_model_len=4096, num_blocks=320)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def ui_server(long_engine):
    choice = ModelChoice(long_engine.config.model, "tiny-llava", untrained=True, example_dirs=[EXAMPLES])
    # ignore_eos under the UI's own settings: a random model could otherwise end before Stop is pressed
    server = start_server(long_engine, choice, sampling_defaults={"ignore_eos": True})
    yield server
    server.stop()
