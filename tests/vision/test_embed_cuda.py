"""Encoding images on the GPU never waits for the device: the engine thread launches an image step while the
previous step still runs (async scheduling), so a host-device sync there (a pageable copy of the pixels, a read
of a device tensor) would idle the GPU for the whole host side of the step."""

import pytest
import torch
from transformers import AutoProcessor

from tests.vision.references import conversations, image, rel_err
from tests.vision.tiny_vlm import make_tiny_llava, make_tiny_qwen_vl
from vlchat.llm.weights import load_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

MODELS = {"llava": make_tiny_llava, "qwen2.5-vl": lambda path: make_tiny_qwen_vl(path, "2.5")}


@pytest.mark.parametrize("family", sorted(MODELS))
def test_embed_multimodal_queues_its_work_without_a_host_sync(family, tmp_path):
    model_dir = MODELS[family](tmp_path)
    processor = AutoProcessor.from_pretrained(model_dir)
    on_gpu = load_model(model_dir, dtype=torch.float16, device="cuda", progress=False)
    on_gpu.use_vision_graphs = False  # a graph capture synchronizes once per image size, by design
    model_cls = type(on_gpu)
    prompt = model_cls.process_prompt(processor, conversations(image)["two_images"], {})
    datas = [item.data for item in prompt.images]  # on the host, as the processor leaves them
    assert len(datas) == 2 and all(not t.is_cuda for d in datas for t in d.values())
    with torch.inference_mode():
        on_gpu.embed_multimodal(datas)  # the kernels compile (and tune) outside the checked call
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = on_gpu.embed_multimodal(datas)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        expected = load_model(model_dir, dtype=torch.float32, progress=False).embed_multimodal(datas)
    assert [g.shape for g in got] == [e.shape for e in expected]
    assert all(rel_err(g.float().cpu(), e) < 1e-2 for g, e in zip(got, expected, strict=True))
