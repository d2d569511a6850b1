"""The host-output benchmark: its measurement (tiny sizes) and its report."""

from benchmarks.host_outputs import REPORT_MODES, markdown, measure
from vlchat.llm.engine import request


def test_measure_times_every_mode_and_restores_the_deferral():
    kept = request.DEFERRED_TOKENS
    res = measure(batch=2, max_tokens=6, rounds=1, delivery_steps=3)
    assert request.DEFERRED_TOKENS == kept
    assert set(res["report_ms"]) == set(REPORT_MODES) and res["steps"] >= 6
    assert all(len(v) == 1 and v[0] > 0 for v in res["report_ms"].values())
    assert all(0 < res["longest_step_ms"][m][0] <= res["report_ms"][m][0] for m in REPORT_MODES)
    assert all(len(v) == 1 and v[0] > 0 for v in res["delivery_us"].values())


def test_markdown_gives_each_mode_against_the_peers():
    res = {"device": "a CPU", "date": "2026-12-01", "python": "3.11", "torch": "2.14", "batch": 128,
           "max_tokens": 256, "rounds": 3, "steps": 257,
           "report_ms": {"streamed": [514.0] * 3, "unstreamed, every step": [257.0] * 3, "unstreamed": [128.5] * 3},
           "longest_step_ms": {"streamed": [3.0] * 3, "unstreamed, every step": [2.0] * 3, "unstreamed": [9.5] * 3},
           "delivery_us": {"per_output": [1600.0, 1500.0, 1700.0], "per_loop": [16.0] * 3}}  # fmt: skip
    text = markdown(res)
    assert "| streamed | 2000 | 2.00x | 3000 |" in text and "| unstreamed, every step | 1000 | 1.00x | 2000 |" in text
    assert "| unstreamed | 500 | 0.50x | 9500 |" in text
    assert "| a wake-up per output (the peer, before) | 1600 | 1.000x |" in text
    assert "| one wake-up per loop (`deliver`) | 16 | 0.010x |" in text
