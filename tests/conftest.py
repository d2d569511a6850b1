"""Test-wide setup: runs before any test module (and so before any kernel) is imported."""

import os

import pytest

# Nothing may reach a hub or phone home from the tests.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Every direct kernel launch is checked against Triton's own specialization (kernels/launch.py).
os.environ.setdefault("VLCHAT_LAUNCH_CHECK", "1")

import torch  # noqa: E402

# Triton decides between compiled and interpreted kernels when a kernel is
# decorated, so the interpreter must be chosen before any kernels module loads.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.manual_seed(0)


@pytest.fixture(scope="session")
def demo_engine():
    """The engine over the shipped demo model (1024 positions)."""
    from tests.app.live import demo_choice, start_engine

    engine = start_engine(demo_choice().path, max_model_len=1024)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def demo_server(demo_engine):
    """The app over the shipped demo model, whose greedy answers about the example images are known."""
    from tests.app.live import demo_choice, start_server

    server = start_server(demo_engine, demo_choice())
    yield server
    server.stop()
