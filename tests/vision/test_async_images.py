"""AsyncEngine with images: a request's image preprocessing never holds up the engine thread."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from PIL import Image

from tests.vision.tiny_vlm import make_tiny_llava, make_tiny_qwen_vl
from vlchat.llm import AsyncEngine, SamplingParams

ENGINE_THREAD = "vlchat-engine"
MODELS = {"llava": make_tiny_llava, "qwen2.5-vl": lambda path: make_tiny_qwen_vl(path, "2.5")}


@pytest.fixture(scope="module", params=sorted(MODELS))
def engine(request, tmp_path_factory):
    model_dir = MODELS[request.param](tmp_path_factory.mktemp("async-images"))
    engine = AsyncEngine.from_options(str(model_dir), dtype="float32", device="cpu", num_blocks=64, block_size=4)
    yield engine
    engine.shutdown()


async def collect(engine, request_id, prompt, params):
    return [out async for out in engine.generate(request_id, prompt, params)]


async def test_the_engine_serves_other_requests_while_a_large_image_is_preprocessed(engine):
    """The image processor of one request is held mid-preprocessing until another request has been added,
    run to its end and reported: were preprocessing on the engine thread, that request could not even be added."""
    image_processor = engine.engine._processor().image_processor
    entered, release = threading.Event(), threading.Event()
    threads = []
    real_preprocess = image_processor.preprocess

    def held_preprocess(*args, **kwargs):
        threads.append(threading.current_thread().name)
        entered.set()
        release.wait(timeout=120)
        return real_preprocess(*args, **kwargs)

    image_processor.preprocess = held_preprocess
    pixels = np.random.default_rng(0).integers(0, 256, size=(2048, 2048, 3), dtype=np.uint8)
    with_image = [{"role": "user", "content": [{"type": "image", "image": Image.fromarray(pixels)},
                                                {"type": "text", "text": "What is in the picture?"}]}]  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    try:
        image_task = asyncio.create_task(collect(engine, "image", with_image, params))
        assert await asyncio.to_thread(entered.wait, 60), "the image request never reached its preprocessing"
        text_outs = await asyncio.wait_for(collect(engine, "text", "The quick brown fox", params), timeout=60)
        assert text_outs[-1].finished and len(text_outs[-1].outputs[0].token_ids) == 16
        assert not image_task.done() and not release.is_set()  # the image was still being preprocessed meanwhile
    finally:
        release.set()
        image_processor.preprocess = real_preprocess
    image_outs = await asyncio.wait_for(image_task, timeout=60)
    final = image_outs[-1]
    assert final.finished and len(final.outputs[0].token_ids) == 16
    assert threads and ENGINE_THREAD not in threads
    assert engine.num_free_blocks() == 64
