"""The paged-read benchmark's report (GPU-free)."""

from benchmarks.paged_read import CONTEXTS, METHODS, markdown
from tests.benchmarks.tables import result, table_at


def test_markdown_gives_each_method_its_times_rate_and_fixed_cost():
    # times on exact lines (us per GB, us): the floor fastest, then SDPA, the reads, the decodes
    lines_of = {"read floor": (216.0, 3.0), "sdpa": (218.0, 8.7), "read, contiguous": (217.5, 2.9),
                "decode, contiguous": (219.3, 5.2), "read, paged": (220.8, 3.8), "decode, paged": (222.7, 4.8)}  # fmt: skip
    gbs = (0.5, 1.0, 2.0, 4.0)
    points = [
        {"ctx": c, "kv_gb": gb, "plan": "gluon 64/2 S=8", "us": {m: s * gb + i for m, (s, i) in lines_of.items()}}
        for c, gb in zip(CONTEXTS, gbs, strict=True)
    ]
    res = result(pdl=True, rounds=5, points=points)
    lines = markdown(res).splitlines()
    assert lines[0] == "# Reading a paged cache before any math on GPU"
    assert "32k: gluon 64/2 S=8, 64k: gluon 64/2 S=8" in lines[2]
    header = table_at(lines, "| method |", len(METHODS))
    assert lines[header] == (
        "| method | L=32k us | L=64k us | L=128k us | L=256k us | GB/s | share of read floor rate | fixed cost us |"
    )
    assert lines[header + 2] == "| read floor | 111.0 | 219.0 | 435.0 | 867.0 | 4630 | 1.000 | 3.0 |"
    assert lines[header + 3] == "| SDPA | 117.7 | 226.7 | 444.7 | 880.7 | 4587 | 0.991 | 8.7 |"
    assert lines[header + 7] == "| decode, paged | 116.1 | 227.5 | 450.2 | 895.6 | 4490 | 0.970 | 4.8 |"
