"""The serving benchmark with images: its image workload, and a CPU run of the image path end to end."""

import json

import pytest

from benchmarks import random_vlm, serving, workloads
from benchmarks.serving_images import ENGINE_THREAD


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


def test_image_run_on_cpu_reports_engine_and_transformers(tmp_path):
    """Three requests with two images each through the engine, one through transformers' generate."""
    out = tmp_path / "serving-llava-smoke-images"
    serving.main(["--shape", "llava-smoke", "--images", "2", "--num-prompts", "3", "--concurrency", "3",
                  "--seed", "7", "--backend", "vlchat", "transformers", "--peer-num-prompts", "1",
                  "--peer-batch", "1", "--dtype", "float32", "--model-dir", str(tmp_path / "model"),
                  "--out", str(out)])  # fmt: skip
    report = json.loads(out.with_suffix(".json").read_text())
    requests = workloads.sharegpt_like_v1(3, random_vlm.text_vocab("llava-smoke"), seed=7, special_ids=(0, 1))
    ours, peer = report["results"]["vlchat"], report["results"]["transformers"]
    assert ours["completed"] == 3 and ours["failed"] == 0 and peer["completed"] == 1 and peer["failed"] == 0
    out_tokens = sum(r.output_len for r in requests)
    assert ours["output_tok_s"] * ours["duration_s"] == pytest.approx(out_tokens)
    assert peer["output_tok_s"] * peer["duration_s"] == pytest.approx(requests[0].output_len)
    # every prompt: its text's tokens, 2 x 576 image tokens (CLIP/336) and the template's "user:" and "assistant:"
    in_tokens = sum(r.prompt_len for r in requests) + 3 * (2 * 576 + 2)
    assert ours["input_tok_s"] * ours["duration_s"] == pytest.approx(in_tokens)
    assert peer["input_tok_s"] * peer["duration_s"] == pytest.approx(requests[0].prompt_len + 2 * 576 + 2)
    images = report["backend_info"]["vlchat"]["images"]
    assert images["preprocess"]["calls"] == 3 and images["vision"]["images_encoded"] == 6
    assert images["preprocess"]["on_engine_thread_s"] == 0.0 and ENGINE_THREAD not in images["preprocess"]["threads"]
    assert 0.0 < images["vision"]["share_of_step_time"] < 1.0
    assert report["workload"]["images_per_request"] == 2
    assert "vision tower share of step time" in out.with_suffix(".md").read_text()
