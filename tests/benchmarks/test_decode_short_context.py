"""The short-context decode benchmark's report and its one-tile baseline (GPU-free)."""

from benchmarks.decode_short_context import markdown, one_tile_count
from tests.benchmarks.tables import result, table_at
from tests.kernels.attention_helpers import plan_inputs, sim_device
from vlchat.kernels.attention.configs import TABLES


def test_markdown_reports_the_plan_against_one_tile_splits_the_sweep_and_sdpa():
    row = {"q_heads": 28, "kv_heads": 4, "head_dim": 128, "batch": 1, "ctx": 3072, "kv_mb": 6.0,
           "config": "WsDecodeConfig(block_n=64, num_stages=2, ctas_per_sm=2)", "splits": 24, "plan_us": 5.5,
           "one_tile_splits": 48, "one_tile_us": 6.6, "best_fixed_splits": 24, "best_fixed_us": 5.5,
           "sdpa_us": 11.0, "sweep_us": {"24": 5.5, "48": 6.6}}  # fmt: skip
    res = result(rounds=3, statistic="median", rows=[row])
    lines = markdown(res).splitlines()
    assert lines[0] == "# Decode at short contexts on GPU"
    assert "the median of 3 interleaved CUDA-graph timings" in lines[2]
    del res["statistic"]  # results written before it was recorded took the least
    assert "the least of 3 interleaved CUDA-graph timings" in markdown(res).splitlines()[2]
    header = table_at(lines, "| heads |", 1)
    assert lines[header + 2] == (
        "| 28/4 | 128 | 1 | 3072 | 6.0 | gluon(block_n=64, num_stages=2, ctas_per_sm=2) | 24 | 5.50 | 48 | 6.60 "
        "| 0.833 | 5.50 (24) | 1.000 | 11.00 | 2.00x |"
    )


def test_one_tile_count_is_the_wave_models_count_without_the_gluon_floor():
    sm90 = sim_device((9, 0), sm_count=132)
    q, k_cache, tables = plan_inputs(1, 3072, 28, 4)
    waves = TABLES["sm_90"].decode_ws_config(128, grid="waves")
    assert one_tile_count(q, k_cache, tables, sm90, waves) == 48
