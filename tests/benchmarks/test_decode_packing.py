"""The packed-heads decode benchmark's report (GPU-free)."""

from benchmarks.decode_packing import markdown
from tests.benchmarks.tables import result, table_at


def test_markdown_reports_each_packing_against_the_unpacked_grid_and_the_plan():
    rows = [
        {"q_heads": 32, "kv_heads": 8, "batch": 128, "ctx": 512, "kv_mb": 256.0, "units": 1024, "slots": 264,
         "us": {"1": 66.5, "2": 65.8, "4": 64.9}, "plan_splits": 1, "plan_pack": 4},
        {"q_heads": 28, "kv_heads": 4, "batch": 64, "ctx": 256, "kv_mb": 32.0, "units": 256, "slots": 264,
         "us": {"1": 11.0, "2": 11.7}, "plan_splits": 1, "plan_pack": 1},
    ]  # fmt: skip
    lines = markdown(result(rounds=7, rows=rows)).splitlines()
    assert lines[0] == "# KV heads packed per decode CTA on GPU"
    assert "the median of 7 interleaved CUDA-graph timings" in lines[2]
    header = table_at(lines, "| heads |", 2)
    assert lines[header + 2] == (
        "| 32/8 | 128 | 512 | 256 | 1024 | 66.5 | 1.94 | 65.8 | 1.011 | 0.97 | 64.9 | 1.025 | S=1, 4 |"
    )
    assert lines[header + 3] == "| 28/4 | 64 | 256 | 32 | 256 | 11.0 | 0.48 | 11.7 | 0.940 | - | - | - | S=1, 1 |"
