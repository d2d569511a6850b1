"""The bandwidth-bound decode benchmark's report (GPU-free)."""

import pytest

from benchmarks.decode_bandwidth import LAYOUTS, LINE_CONTEXTS, fit_line, markdown
from tests.benchmarks.tables import result, table_at


def test_markdown_puts_each_layout_against_the_read_floor_and_sdpa():
    us = {"sdpa": 465.0, "shuffled 16": 471.0, "in order 16": 469.0, "free lists 16": 470.0, "runs 16": 467.0,
          "in order 64": 465.0}  # fmt: skip
    plans = {name: "gluon 64/2 S=8" for name in LAYOUTS}
    row = {"dtype": "float16", "q_heads": 32, "kv_heads": 32, "batch": 1, "ctx": 131072, "kv_mb": 2048.0,
           "plans": plans, "us": us, "read_floor_us": 460.35}  # fmt: skip
    res = result(pdl=True, rounds=5, rows=[row])
    lines = markdown(res).splitlines()
    assert lines[0] == "# Bandwidth-bound decode against the read floor on GPU"
    header = table_at(lines, "| dtype |", 1)
    assert lines[header + 2] == (
        "| float16 | 32/32 | 1 | 131072 | 2048 | 460.4 | 465.0 / 0.990 | 471.0 / 0.977 (gluon 64/2 S=8) | 0.987x "
        "| 469.0 / 0.982 (gluon 64/2 S=8) | 0.991x | 470.0 / 0.979 (gluon 64/2 S=8) | 0.989x "
        "| 467.0 / 0.986 (gluon 64/2 S=8) | 0.996x | 465.0 / 0.990 (gluon 64/2 S=8) | 1.000x |"
    )


def test_fit_line_recovers_an_exact_line_and_the_least_squares_one():
    assert fit_line([0.25, 0.5, 1.0, 2.0], [59.0, 114.0, 224.0, 444.0]) == pytest.approx((220.0, 4.0))
    # points off a line: the least-squares fit, not a line through two of them
    slope, intercept = fit_line([1.0, 2.0, 3.0], [1.0, 3.0, 2.0])
    assert (slope, intercept) == pytest.approx((0.5, 1.0))


def test_markdown_gives_each_method_its_streaming_rate_and_fixed_cost():
    # times on exact lines: floor 216 us/GB + 2, SDPA 220 + 7, ours 224 + 4 and 223 + 4.5
    per_gb = {
        "read floor": (216.0, 2.0),
        "sdpa": (220.0, 7.0),
        "shuffled 16": (224.0, 4.0),
        "in order 16": (223.0, 4.5),
    }
    points = [{"ctx": c, "kv_gb": gb, "us": {m: s * gb + i for m, (s, i) in per_gb.items()}}
              for c, gb in zip(LINE_CONTEXTS, (0.25, 0.5, 1.0, 2.0, 4.0), strict=True)]  # fmt: skip
    res = result(pdl=True, rounds=5, rows=[], lines=[{"q_heads": 32, "kv_heads": 32, "points": points}])
    lines = markdown(res).splitlines()
    assert "## Streaming rate and fixed cost" in lines
    header = table_at(lines, "| heads | method |", 4)
    assert lines[header + 2 : header + 6] == [
        "| 32/32 | read floor | 4630 | 1.000 | 2.0 |",
        "| 32/32 | SDPA | 4545 | 0.982 | 7.0 |",
        "| 32/32 | ours, shuffled 16 | 4464 | 0.964 | 4.0 |",
        "| 32/32 | ours, in order 16 | 4484 | 0.969 | 4.5 |",
    ]
