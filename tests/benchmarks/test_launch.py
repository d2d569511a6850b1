"""The eager-launch benchmark: its measurement on this machine's path (the torch references on a CPU) and its
report."""

from benchmarks.launch import LAYER_CALLS, markdown, measure
from tests.benchmarks.tables import result
from vlchat.kernels import settings


def test_measure_times_every_case_both_ways_and_restores_the_setting():
    for kept in (False, True):  # whichever it was before, it is after
        with settings.launching_directly(kept):
            rows = measure("cpu", rounds=1, calls=2)
            assert settings.launch_direct() is kept
    assert {r["case"] for r in rows} >= set(LAYER_CALLS)
    assert all(r["before_us"] > 0 and r["now_us"] > 0 and len(r["before_all"]) == 1 for r in rows)


def test_markdown_reports_savings_the_layer_sum_and_the_engine_steps():
    rows = [{"case": name, "before_us": 20.0, "now_us": 10.0} for name in LAYER_CALLS]
    rows.append({"case": "torch add", "before_us": 7.0, "now_us": 7.0})
    engine = {"batch": 128, "direct_ms": 29.0, "kernel_grid_ms": 33.35, "direct_all": [29.0] * 10,
              "kernel_grid_all": [33.35] * 10}  # fmt: skip
    text = markdown(result(rounds=5, calls=300, rows=rows, engine=engine))
    assert "| rms_norm + residual | 20.0 | 10.0 | 10.0 | 2.00x |" in text
    assert "| torch add | 7.0 | 7.0 | 0.0 | 1.00x |" in text
    assert "140 us of host time before, 70 us now" in text  # 7 calls per layer (rms_norm twice)
    assert "33.35 ms with every launch through kernel[grid], 29.00 ms with direct launches (1.150x)" in text
