"""The attention benchmark's target checks and Markdown table, on synthetic rows (no GPU)."""

from benchmarks.attention_report import config_name, markdown, targets
from vlchat.kernels.attention.configs import DecodeConfig, WsDecodeConfig


def _decode_row(ours, sdpa, best, kv_mb=512.0, copy_gbs=4000.0, batch=1):
    us_floor = kv_mb * 2**20 / (copy_gbs * 1e3)
    return {
        "dtype": "float16", "q_heads": 32, "kv_heads": 8, "batch": batch, "ctx": 32768, "kv_mb": kv_mb,
        "heuristic_splits": 32, "heuristic_config": "64/4/6", "ours_us": ours, "ours_no_pdl_us": ours + 1, "sdpa_us": sdpa,
        "best_fixed": "64/4/4 S=64", "best_fixed_us": best, "bw_frac": us_floor / ours, "sdpa_bw_frac": us_floor / sdpa,
    }  # fmt: skip


def test_targets_judge_each_decode_row_against_its_peers():
    fast = _decode_row(ours=120.0, sdpa=125.0, best=118.0)  # faster than SDPA, within 10% of the best split
    slow = _decode_row(ours=140.0, sdpa=125.0, best=120.0, batch=8)  # slower than SDPA, 17% off the best split
    t = targets([fast, slow], [])
    missed = ["float16 32/8 B=8 L=32768"]  # the slow row by name: an inverted comparison would name the other
    assert t["decode_never_slower_than_sdpa"] == {"met": False, "missed": missed, "cases": 2}
    assert t["decode_never_slower_than_sdpa_on_the_engines_pages"]["cases"] == 0  # rows without the engine's pages
    fast["ours_engine_pages_us"], slow["ours_engine_pages_us"] = 126.0, 124.0  # judged on their own times
    engine = targets([fast, slow], [])["decode_never_slower_than_sdpa_on_the_engines_pages"]
    assert engine == {"met": False, "missed": ["float16 32/8 B=1 L=32768"], "cases": 2}
    assert t["heuristic_within_10pct_of_best_fixed"]["missed"] == missed
    assert t["decode_0.95_copy_bw_where_kv_over_256MB"]["cases"] == 2
    assert t["prefill_0.9x_sdpa"] == {"met": True, "missed": [], "cases": 0}


def test_markdown_names_the_heuristic_config_and_the_best_fixed_choice():
    res = {
        "device": "GPU", "date": "2026-11-30", "torch": "2", "triton": "3", "python": "3.12", "copy_gbs": 4000.0,
        "decode_config": "D", "decode_deep_config": "DD", "decode_ws_config": "WD", "decode_ws_short_config": "WS",
        "prefill_config": "P", "decode": [_decode_row(ours=120.0, sdpa=125.0, best=118.0)], "prefill": [],
        "step": [{"dtype": "float16", "q_heads": 32, "kv_heads": 8, "batch": 1, "ctx": 4096, "pdl_us": 10.5,
                  "no_pdl_us": 12.7}],
    }  # fmt: skip
    res["targets"] = targets(res["decode"], res["prefill"])
    text = markdown(res)
    assert "| 64/4/6 S=32 | 120.0 | 121.0 | 118.0 (64/4/4 S=64) | 125.0 | 1.042x | - | - |" in text  # no engine pages
    engine = markdown({**res, "decode": [{**res["decode"][0], "ours_engine_pages_us": 124.0}]})
    assert "| 125.0 | 1.042x | 124.0 | 1.008x |" in engine
    assert "| float16 | 32/8 | 1 | 4096 | 10.5 | 12.7 | 17.3% |" in text
    assert "for one-wave grids: warp-specialized WD (where its splits read at most 2048 keys: WS), deep DD" in text
    assert "- prefill_0.9x_sdpa: not measured in this run" in text
    assert config_name(DecodeConfig(64, 4, 6, 2)) == "64/4/6"
    assert config_name(WsDecodeConfig(64, 4, 1)) == "gluon 64/4"
    assert config_name(WsDecodeConfig(64, 2, 2, True, 2048)) == "gluon 64/2 half 2048"
    assert config_name(WsDecodeConfig(64, 2, 1, True, registers=168)) == "gluon 64/2 r168"
    assert config_name(WsDecodeConfig(64, 2, 2, True, pack_heads=4, pack_max_keys=2048)) == "gluon 64/2 pack 4"
    assert config_name(WsDecodeConfig(64, 2, 2, True, steal_tiles=4), 8) == "gluon 64/2 steal 4"
    assert config_name(WsDecodeConfig(64, 2, 2, True, steal_tiles=4), 1) == "gluon 64/2"  # unsplit: no stealing
    long = markdown({**res, "decode_ws_long_config": "WL"})
    assert "(where its splits read at most 2048 keys: WS) (where it would split 16 ways into longer splits: WL" in long
    assert "into longer splits" not in text  # a result written before the long-split config names none
    assert "interleaved" not in text  # nor one written before the rounds
    rounds = {"ours_us": [121.0, 120.0, 120.5], "sdpa_us": [125.0, 126.0, 125.5]}
    timed = markdown({**res, "decode": [{**res["decode"][0], "rounds_us": rounds}]})
    assert "Ours, best fixed and SDPA: the median of 3 interleaved measurements" in timed
    assert "the median of 5 interleaved" in markdown({**res, "rounds": 5})  # as the result records it


def _prefill_row(ours, sdpa=None, prefix=0, batch=4):
    row = {"dtype": "bfloat16", "batch": batch, "length": 4096, "prefix": prefix, "kernel": "gluon-ws",
           "ours_tflops": ours, "triton_tflops": 430.0, "pages_tflops": 280.0}  # fmt: skip
    return row if sdpa is None else {**row, "sdpa_tflops": sdpa, "rel_err_vs_sdpa": 1e-3}


def test_prefill_rows_name_the_kernel_and_judge_fresh_rows_only():
    rows = [_prefill_row(507.0, 533.0), _prefill_row(470.0, 533.0, batch=1), _prefill_row(500.0, prefix=4096)]
    t = targets([], rows)
    assert t["prefill_0.9x_sdpa"] == {"met": False, "missed": ["bfloat16 B=1 L=4096"], "cases": 2}
    res = {
        "device": "GPU", "date": "2026-11-30", "torch": "2", "triton": "3", "python": "3.12", "copy_gbs": 4000.0,
        "decode_config": "D", "decode_deep_config": "DD", "decode_ws_config": "WD", "prefill_config": "P", "prefill_ws_config": "W",
        "decode": [], "prefill": rows, "targets": t,
    }  # fmt: skip
    text = markdown(res)
    assert "| bfloat16 | 4 | 4096 | 0 | gluon-ws | 507 | 430 | 280 | 533 | 0.95 | 1.0e-03 |" in text
    assert "| bfloat16 | 4 | 4096 | 4096 | gluon-ws | 500 | 430 | 280 | - | - | - |" in text
    assert "(warp-specialized: W)" in text
    assert "where its splits read" not in text  # a result without a short-split config names none
    assert "where its splits read" not in markdown({**res, "decode_ws_short_config": "None"})  # an arch without
