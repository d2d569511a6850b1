"""The serving benchmark's workload and statistics (the parts that decide what its numbers mean)."""

import math

import numpy as np
import pytest

from benchmarks import workloads
from benchmarks.serving_metrics import RequestRecord, summarize


def test_sharegpt_like_v1_is_seeded_clipped_and_has_the_stated_laws():
    a = workloads.sharegpt_like_v1(4000, vocab_size=32000, seed=3, special_ids=(0, 1))
    b = workloads.sharegpt_like_v1(4000, vocab_size=32000, seed=3, special_ids=(0, 1))
    assert [r.prompt_token_ids for r in a[:50]] == [r.prompt_token_ids for r in b[:50]]
    prompt = np.array([r.prompt_len for r in a])
    output = np.array([r.output_len for r in a])
    assert prompt.min() >= 4 and prompt.max() <= 1024 and output.min() >= 4 and output.max() <= 1024
    # log-normal, sigma 1, median exp(ln(mean) - 0.5): the median survives the clipping
    assert np.median(prompt) == pytest.approx(math.exp(math.log(248) - 0.5), rel=0.06)
    assert np.median(output) == pytest.approx(math.exp(math.log(232) - 0.5), rel=0.06)
    assert np.log(prompt[(prompt > 4) & (prompt < 1024)]).std() == pytest.approx(0.9, abs=0.12)
    assert not {0, 1} & {t for r in a[:200] for t in r.prompt_token_ids}  # no BOS/EOS in prompts


def test_poisson_arrivals_have_the_requested_rate():
    t = workloads.arrival_times(20000, request_rate=50.0, seed=1)
    assert np.all(np.diff(t) >= 0) and 20000 / t[-1] == pytest.approx(50.0, rel=0.03)
    assert not workloads.arrival_times(5, math.inf).any()


def test_summary_counts_tokens_and_latencies():
    recs = []
    for i in range(4):
        r = RequestRecord(prompt_len=10, send_time=0.0)
        r.token_times = [0.1 * (i + 1), 0.1 * (i + 1) + 0.02, 0.1 * (i + 1) + 0.06]
        r.chunk_tokens = [1, 1, 2]  # the last chunk carried two tokens
        r.output_len = 4
        recs.append(r)
    failed = RequestRecord(prompt_len=10, send_time=0.0, ok=False, error="HTTP 500")
    s = summarize(recs + [failed], duration=2.0)
    assert s["completed"] == 4 and s["failed"] == 1 and s["request_throughput"] == 2.0
    assert s["output_tok_s"] == 8.0 and s["input_tok_s"] == 20.0
    assert s["ttft_ms"]["mean"] == pytest.approx(250.0)
    assert s["tpot_ms"]["mean"] == pytest.approx(20.0)  # 60 ms over 3 later tokens
    assert s["itl_ms"]["median"] == pytest.approx(20.0)
    assert s["errors"] == ["HTTP 500"]
