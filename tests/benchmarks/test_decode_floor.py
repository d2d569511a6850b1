"""The batch-1 decode floor benchmark's report (GPU-free)."""

from benchmarks.decode_floor import markdown
from tests.benchmarks.tables import result


def test_markdown_reports_the_ratios_the_reading_rests_on():
    row = {"length": 4096, "kv_mb": 16.0, "splits": 16, "config": "WD", "plan_us": 9.6, "kernel_us": 8.5,
           "reduce_us": 1.2, "read_floor_us": 5.4, "empty_us": 0.8, "sdpa_us": 12.0}  # fmt: skip
    res = result(pdl=True, rows=[row])
    text = markdown(res)
    assert "| 4096 | 16 | 16 | 9.60 | 8.50 | 1.20 | 5.40 | 0.80 | 12.00 | 1.25x | 8.00 | 1.78 |" in text
