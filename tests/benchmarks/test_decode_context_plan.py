"""The context-bucket decode plan benchmark's report (GPU-free)."""

from benchmarks.decode_context_plan import markdown
from tests.benchmarks.tables import result, table_at


def test_markdown_reports_both_plans_and_their_ratio():
    row = {"q_heads": 32, "kv_heads": 8, "batch": 128, "ctx": 1024, "max_model_len": 32768, "kv_mb": 512.0,
           "bucket": 1024, "us": {"bound": 163.6, "bucket": 125.3},
           "plans": {"bound": "gluon 64/2 S=9", "bucket": "gluon 64/2 S=1"}}  # fmt: skip
    lines = markdown(result(rounds=7, rows=[row])).splitlines()
    assert lines[0] == "# Decode planned per context bucket on GPU"
    header = table_at(lines, "| heads |", 1)
    assert lines[header + 2] == (
        "| 32/8 | 128 | 1024 | 32768 | 512 | gluon 64/2 S=9 | 163.6 | 1024 | gluon 64/2 S=1 | 125.3 | 1.306 |"
    )
