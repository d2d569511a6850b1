"""How the GPU benchmarks take their timings in turn (GPU-free: the graph timing replaced by a recorder)."""

from benchmarks import gpu_timing


def test_interleaved_medians_take_each_entry_in_turn_and_give_its_median(monkeypatch):
    order, times = [], iter([5.0, 1.0, 7.0, 2.0, 6.0, 3.0])
    monkeypatch.setattr(gpu_timing, "graph_time_us", lambda fns: order.append(fns[0]) or next(times))
    medians = gpu_timing.interleaved_medians({"a": ["fa"], "b": ["fb"]}, rounds=3)
    assert order == ["fa", "fb"] * 3  # rounds over every entry, not one entry's rounds back to back
    assert medians == {"a": 6.0, "b": 2.0}


def test_interleaved_timings_names_the_statistic_the_rounds_and_the_script():
    assert gpu_timing.interleaved_timings(7, "decode_packing.py") == (
        "the median of 7 interleaved CUDA-graph timings of back-to-back calls, L2 defeated "
        "(benchmarks/decode_packing.py says what each column runs)."
    )
    assert gpu_timing.interleaved_timings(3, "x.py", "least").startswith("the least of 3 interleaved")
