"""The head_dim-256 decode benchmark's report (GPU-free)."""

from benchmarks.decode_head_dim import markdown


def test_markdown_reports_the_plan_against_triton_and_sdpa():
    row = {"dtype": "float16", "q_heads": 8, "kv_heads": 4, "batch": 1, "ctx": 4096, "kv_mb": 32.0,
           "plan_config": "gluon 64/2", "plan_splits": 32, "plan_us": 8.0, "triton_config": "32/4/3",
           "triton_splits": 64, "triton_us": 12.0, "sdpa_us": 14.0, "max_diff": 6.1e-5}  # fmt: skip
    res = {"device": "GPU", "date": "today", "torch": "t", "triton": "tr", "python": "p", "head_dim": 256,
           "copy_gbs": 4000.0, "rows": [row]}  # fmt: skip
    text = markdown(res)
    assert text.startswith("# Paged decode at head_dim 256 on GPU")
    # 32 MB in 8 us against 4000 GB/s: 32 * 2**20 / 8 / 4e3 = 1.05
    assert (
        "| float16 | 8/4 | 1 | 4096 | 32 | gluon 64/2 S=32 | 8.0 | 32/4/3 S=64 | 12.0 | 14.0 | 0.67 | 1.75x | 1.05 | 6.1e-05 |"
        in text
    )
