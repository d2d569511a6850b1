"""The head_dim-256 attention benchmark's report (GPU-free)."""

from benchmarks.attention_head_dim import markdown
from tests.benchmarks.tables import assert_table, result


def test_markdown_reports_decode_and_prefill_against_triton_and_sdpa():
    decode = {"dtype": "float16", "q_heads": 8, "kv_heads": 4, "batch": 1, "ctx": 4096, "kv_mb": 32.0,
              "plan_config": "gluon 64/2", "plan_splits": 32, "plan_us": 8.0, "triton_config": "32/4/3",
              "triton_splits": 64, "triton_us": 12.0, "sdpa_us": 14.0, "max_diff": 6.1e-5}  # fmt: skip
    causal = {"dtype": "bfloat16", "q_heads": 16, "kv_heads": 8, "batch": 1, "length": 4096, "window": None,
              "kernel": "gluon-ws", "ours_tflops": 450.0, "triton_tflops": 250.0, "sdpa_tflops": 500.0,
              "rel_err_vs_sdpa": 3e-3, "max_diff_vs_triton": 9.8e-4}  # fmt: skip
    windowed = dict(causal, window=1024, ours_tflops=360.0, triton_tflops=200.0)
    del windowed["sdpa_tflops"], windowed["rel_err_vs_sdpa"]
    res = result(head_dim=256, copy_gbs=4000.0, decode=[decode], prefill=[causal, windowed])
    text = markdown(res)
    assert text.startswith("# Attention at head_dim 256 on GPU")
    lines = text.splitlines()
    decode_header = lines.index("## Decode (CUDA-graph replays, L2 defeated)") + 2
    prefill_header = lines.index("## Prefill (fresh sequences, causal; a window of 1024 where named)") + 2
    assert decode_header < prefill_header
    assert_table(lines, decode_header, 1)
    assert_table(lines, prefill_header, 2)
    assert "| plan us | Triton plan (config, splits) | Triton us | SDPA us | plan / Triton |" in lines[decode_header]
    assert "| ours TFLOP/s | Triton TFLOP/s | SDPA TFLOP/s | ours / Triton | ours / SDPA |" in lines[prefill_header]
    # 32 MB in 8 us against 4000 GB/s: 32 * 2**20 / 8 / 4e3 = 1.05
    assert (
        "| float16 | 8/4 | 1 | 4096 | 32 | gluon 64/2 S=32 | 8.0 | 32/4/3 S=64 | 12.0 | 14.0 | 0.67 | 1.75x | 1.05 | 6.1e-05 |"
        in text
    )
    assert "| bfloat16 | 16/8 | 1 | 4096 | - | gluon-ws | 450 | 250 | 500 | 1.80 | 0.90 | 3.0e-03 | 9.8e-04 |" in text
    assert "| bfloat16 | 16/8 | 1 | 4096 | 1024 | gluon-ws | 360 | 200 | - | 1.80 | - | - | 9.8e-04 |" in text
