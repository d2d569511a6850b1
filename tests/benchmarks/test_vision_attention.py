"""benchmarks/vision_attention.py on tiny shapes (interpreted kernels): every call agrees with SDPA and the table
renders."""

import torch

from benchmarks import vision_attention
from vlchat.kernels.attention.configs import PrefillConfig
from vlchat.kernels.device import get_device_info


def test_rows_agree_with_sdpa_and_render():
    device = get_device_info()
    rows = [vision_attention.bench(*shape, device, torch.float32) for shape in vision_attention.SMOKE]
    assert [r["split_head"] for r in rows] == [[16, 0], [64, 16]]
    assert all(r["ours_rel_err"] < 1e-5 and r["triton_rel_err"] < 1e-5 for r in rows)
    text = vision_attention.markdown({"device": "cpu", "date": "today", "dtype": "float32", "rows": rows})
    assert "| tiny-80 | 2 | 9 | 2 x 80 | triton |" in text


def test_sweep_times_each_config_and_lists_the_fastest_first():
    device = get_device_info()
    grid = [PrefillConfig(16, 16, 4, 1), PrefillConfig(32, 16, 4, 1), PrefillConfig(32, 16, 4, 1, True)]
    rows = vision_attention.sweep("tiny-80", 2, 9, 2, 80, device, torch.float32, grid=grid, ws_grid=[])
    assert len(rows) == 2  # a split head (80 = 64 + 16) reads no TMA boxes: that config is left out
    assert all(r["rel_err"] < 1e-5 for r in rows) and rows[0]["ms"] <= rows[1]["ms"]
    text = vision_attention.markdown({"device": "cpu", "date": "today", "dtype": "float32", "rows": [], "sweep": rows})
    assert "| tiny-80 | 2 | triton | `PrefillConfig(block_m=" in text
