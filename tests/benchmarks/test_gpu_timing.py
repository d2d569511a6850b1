"""How the GPU benchmarks take their timings in turn (GPU-free: the graph timing replaced by a recorder)."""

from benchmarks import gpu_timing


def test_interleaved_medians_take_each_entry_in_turn_and_give_its_median(monkeypatch):
    order, times = [], iter([5.0, 1.0, 7.0, 2.0, 6.0, 3.0])
    monkeypatch.setattr(gpu_timing, "graph_time_us", lambda fns: order.append(fns[0]) or next(times))
    medians = gpu_timing.interleaved_medians({"a": ["fa"], "b": ["fb"]}, rounds=3)
    assert order == ["fa", "fb"] * 3  # rounds over every entry, not one entry's rounds back to back
    assert medians == {"a": 6.0, "b": 2.0}
