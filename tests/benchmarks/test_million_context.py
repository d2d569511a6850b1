"""The million-token benchmark's arithmetic and report (GPU-free)."""

from benchmarks.million_context import FIELDS, capacity, kv_bytes_per_token, markdown, prefill_flops, weight_bytes
from tests.benchmarks.tables import result, table_at


def test_llama3_8b_kv_bytes_and_a_million_tokens_per_format():
    assert kv_bytes_per_token(FIELDS, "auto") == 32 * 2 * 8 * 128 * 2  # 128 KiB: 128 GiB at 2**20 tokens
    assert kv_bytes_per_token(FIELDS, "fp8") * 2**20 == 64 * 2**30
    pool = 66 * 2**30  # fp8 needs 64 GiB for 2**20 tokens, int8 68 GiB (its scales)
    cap = capacity(pool, FIELDS)
    assert cap["fp8"] > 2**20 > cap["int8"] > cap["auto"] == pool // (128 << 10)
    assert 15e9 < weight_bytes(FIELDS) < 16.1e9  # 7.5B parameters in bf16, the embedding table not read


def test_prefill_flops_are_causal_attention_plus_gemms():
    attn, gemm = prefill_flops(FIELDS, 1024)
    assert attn == 4 * 32 * 32 * 128 * 1024 * 1024 / 2
    assert 2 * 6.9e9 * 1024 < gemm < 2 * 7.6e9 * 1024


def test_markdown_reports_decode_and_prefill_against_their_floors():
    res = result(shape="Llama-3-8B", kv_cache_dtype="fp8", context=2**20, chunk_budget=8192, pool_tokens=1100000,
                 pool_gib=67.1, copy_gbs=4000.0, gemm_tflops=800.0,
                 capacity={"auto": 550000, "fp8": 1100000, "int8": 1034000},
                 decode={"ms": 26.0, "floor_ms": 20.0, "weight_gib": 14.0, "kv_gib": 64.0},
                 prefill={"tokens": 524288, "s": 250.0, "attn_tflop": 72.1, "gemm_tflop": 7.9, "floor_s": 100.0})  # fmt: skip
    lines = markdown(res).splitlines()
    table_at(lines, "| measure", 2)
    assert "| decode at 1,048,576 tokens, ms/token | 26.00 | 20.00" in "\n".join(lines)
    assert "| 1.30x |" in lines[6] and "0.40 of the FLOP rate" in lines[7]
    assert "fp8 1,100,000 tokens" in lines[-1]
