"""The serving benchmark with images: its image workload, and a CPU run of the image path end to end."""

import json

import pytest
from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

from benchmarks import random_vlm, serving, workloads
from benchmarks.serving_images import ENGINE_THREAD, _same_batch_ratios


def test_drawn_images_are_seeded_distinct_and_of_the_drawn_sizes():
    a = workloads.with_images(workloads.sharegpt_like_v1(40, 1000, seed=2), per_request=2, seed=2)
    b = workloads.with_images(workloads.sharegpt_like_v1(40, 1000, seed=2), per_request=2, seed=2)
    assert [r.images for r in a] == [r.images for r in b]
    drawn = [im for r in a for im in r.images]
    assert all(len(r.images) == 2 for r in a) and len(set(drawn)) == len(drawn)
    assert all(336 <= im.width <= 1344 and 336 <= im.height <= 1344 for im in drawn)
    assert len({im.width for im in drawn}) > 10  # sizes vary, not one fixed side
    first, other = drawn[0].pil(), drawn[1].pil()
    assert first.size == (drawn[0].width, drawn[0].height) and first.mode == "RGB"
    assert first.tobytes() == drawn[0].pil().tobytes() and first.tobytes()[:3000] != other.tobytes()[:3000]
    with pytest.raises(ValueError):
        workloads.with_images(a, min_side=400, max_side=300)


def image_tokens(shape: str, im) -> int:
    """Placeholder tokens of one drawn image: 576 for CLIP/336; Qwen's resize to 28 px multiples within its pixel
    budget, one token per 28x28 block."""
    if random_vlm.SHAPES[shape]["family"] == "llava":
        return 576
    h, w = smart_resize(im.height, im.width, factor=28, min_pixels=56 * 56,
                        max_pixels=random_vlm.SHAPES[shape]["max_pixels"])  # fmt: skip
    return h * w // 28**2


# the chat template's tokens besides the text and the placeholders: "user:" and "assistant:", and per image
# Qwen's <|vision_start|> and <|vision_end|>
TEMPLATE_TOKENS = {"llava-smoke": (2, 0), "qwen2.5-vl-smoke": (2, 2)}


@pytest.mark.parametrize("shape", sorted(TEMPLATE_TOKENS))
def test_image_run_on_cpu_reports_engine_and_transformers(shape, tmp_path):
    """Three requests with two images each through the engine, one through transformers' generate."""
    out = tmp_path / f"serving-{shape}-images"
    serving.main(["--shape", shape, "--images", "2", "--num-prompts", "3", "--concurrency", "3",
                  "--seed", "7", "--backend", "vlchat", "transformers", "--peer-num-prompts", "1",
                  "--peer-batch", "1", "--dtype", "float32", "--model-dir", str(tmp_path / "model"),
                  "--out", str(out)])  # fmt: skip
    report = json.loads(out.parent.joinpath(out.name + ".json").read_text())
    requests = workloads.sharegpt_like_v1(3, random_vlm.text_vocab(shape), seed=7, special_ids=(0, 1))
    requests = workloads.with_images(requests, 2, seed=7)
    ours, peer = report["results"]["vlchat"], report["results"]["transformers"]
    assert ours["completed"] == 3 and ours["failed"] == 0 and peer["completed"] == 1 and peer["failed"] == 0
    out_tokens = sum(r.output_len for r in requests)
    assert ours["output_tok_s"] * ours["duration_s"] == pytest.approx(out_tokens)
    assert peer["output_tok_s"] * peer["duration_s"] == pytest.approx(requests[0].output_len)
    per_prompt, per_image = TEMPLATE_TOKENS[shape]
    prompt_tokens = [r.prompt_len + per_prompt + sum(image_tokens(shape, im) + per_image for im in r.images)
                     for r in requests]  # fmt: skip
    assert ours["input_tok_s"] * ours["duration_s"] == pytest.approx(sum(prompt_tokens))
    assert peer["input_tok_s"] * peer["duration_s"] == pytest.approx(prompt_tokens[0])
    images = report["backend_info"]["vlchat"]["images"]
    assert images["preprocess"]["calls"] == 3 and images["vision"]["images_encoded"] == 6
    assert images["preprocess"]["on_engine_thread_s"] == 0.0 and ENGINE_THREAD not in images["preprocess"]["threads"]
    assert 0.0 < images["vision"]["share_of_step_time"] < 1.0
    assert report["workload"]["images_per_request"] == 2
    md = out.parent.joinpath(out.name + ".md").read_text()
    assert "vision tower share of step time" in md
    engine = report["backend_info"]["vlchat"]
    assert f"vlchat engine: auto KV cache of {engine['kv_cache_tokens']:,} tokens" in md


def test_steps_while_preprocessing_are_compared_with_quiet_steps_of_their_batch_size():
    # (wall s, preprocessing in flight, batch, launch host s)
    decode = [(0.02, True, 4, 0.006), (0.01, False, 4, 0.002), (0.01, False, 4, 0.004), (0.05, True, 8, 0.01),
              (0.03, True, 4, 0.009)]  # fmt: skip
    same = _same_batch_ratios(decode)
    assert same["steps"] == 2  # the batch-8 step has no quiet step to compare with
    assert same["wall_ratio"] == pytest.approx(2.5) and same["launch_ratio"] == pytest.approx(2.5)
