"""benchmarks/linear_act.py on a tiny shape (interpreted kernel): the fused rows agree with the fp32 product, every
timed path has its row and the table renders."""

import torch

from benchmarks import linear_act


def test_bench_smoke():
    rows = linear_act.bench(*linear_act.SMOKE[0], linear_act.SMOKE_GRID, torch.float16, "cpu")
    assert {r["kernel"].split()[0] for r in rows} == {"cublas+act", "cublas", "fused"}
    fused = next(r for r in rows if r["kernel"].startswith("fused"))
    assert fused["rel_err"] < 1e-3 and fused["speedup"] > 0
    text = linear_act.markdown({"device": "cpu", "date": "today", "dtype": "float16", "config": "None", "rows": rows})
    assert text.count("| tiny |") == 3


def test_vision_tune_picks_a_config_only_where_it_beats_the_unfused_path_on_every_shape():
    from benchmarks.vision_tune import pick_gemm

    def rows(fused_b):
        return [{"shape": "a", "rows": 1, "kernel": "cublas+act", "ms": 2.0},
                {"shape": "b", "rows": 2, "kernel": "cublas+act", "ms": 2.0},
                {"shape": "a", "rows": 1, "kernel": "fused x", "ms": 1.5, "rel_err": 1e-3},
                {"shape": "b", "rows": 2, "kernel": "fused x", "ms": fused_b, "rel_err": 1e-3},
                {"shape": "a", "rows": 1, "kernel": "fused y", "ms": 1.0, "rel_err": 1e-3}]  # fmt: skip (y: one shape)

    assert pick_gemm(rows(1.9)) == "fused x"
    assert pick_gemm(rows(2.1)) is None
