"""The bandwidth-bound decode benchmark's report (GPU-free)."""

from benchmarks.decode_bandwidth import LAYOUTS, markdown
from tests.benchmarks.tables import assert_table


def test_markdown_puts_each_layout_against_the_read_floor_and_sdpa():
    us = {"sdpa": 465.0, "shuffled 16": 471.0, "in order 16": 469.0, "in order 64": 465.0}
    plans = {name: "gluon 64/2 S=8" for name in LAYOUTS}
    row = {"dtype": "float16", "q_heads": 32, "kv_heads": 32, "batch": 1, "ctx": 131072, "kv_mb": 2048.0,
           "plans": plans, "us": us, "read_floor_us": 460.35}  # fmt: skip
    res = {"device": "GPU", "date": "today", "torch": "t", "triton": "tr", "python": "p", "pdl": True, "rounds": 5,
           "rows": [row]}  # fmt: skip
    lines = markdown(res).splitlines()
    assert lines[0] == "# Bandwidth-bound decode against the read floor on GPU"
    header = next(i for i, line in enumerate(lines) if line.startswith("| dtype |"))
    assert_table(lines, header, 1)
    assert lines[header + 2] == (
        "| float16 | 32/32 | 1 | 131072 | 2048 | 460.4 | 465.0 / 0.990 | 471.0 / 0.977 (gluon 64/2 S=8) | 0.987x "
        "| 469.0 / 0.982 (gluon 64/2 S=8) | 0.991x | 465.0 / 0.990 (gluon 64/2 S=8) | 1.000x |"
    )
