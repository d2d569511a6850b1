"""The quantized-KV decode benchmark's CPU-safe parts: the bytes it counts, its inputs and calls (run under the
interpreter against the reference), and its report."""

import pytest

from benchmarks.kv_cache_dtype import FORMATS, bytes_read, decode_calls, markdown, quantized_inputs, sweep_markdown
from tests.benchmarks.tables import result, table_at
from vlchat.kernels.attention import reference
from vlchat.kernels.attention.configs import DecodeConfig
from vlchat.kernels.device import get_device_info


def test_bytes_read_counts_codes_scales_and_rows():
    q_rows = 2 * 1 * 32 * 128 * 2  # q read and out written, fp16
    assert bytes_read("fp16", 32, 8, 1, 1024) == 1024 * 2 * 8 * 128 * 2 + q_rows
    assert bytes_read("fp8", 32, 8, 1, 1024) == 1024 * 2 * 8 * 128 + q_rows
    assert bytes_read("int8", 32, 8, 1, 1024) == 1024 * 2 * 8 * (128 + 8) + q_rows
    assert bytes_read("int4", 32, 8, 1, 1024) == 1024 * 2 * 8 * (64 + 8) + q_rows


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_timed_calls_compute_decode_attention(fmt):
    storage = "fp16" if fmt.startswith("fp16") else fmt
    inputs = quantized_inputs(storage, 4, 2, 2, 48, "cpu", head_dim=64, sets=2)
    q, k_cache, v_cache, k_scale, v_scale, tables, seq_lens = inputs
    assert k_cache.shape[0] == 2 * 2 * 3 and len(set(tables.flatten().tolist())) == k_cache.shape[0]
    calls, splits, _ = decode_calls(fmt, inputs, get_device_info())
    assert len(calls) == 2 and splits >= 1
    for call, table in zip(calls, tables, strict=True):
        out = call()
        ref = reference.paged_decode_attention(
            q.double(), k_cache, v_cache, table, seq_lens, 64**-0.5, k_scale=k_scale, v_scale=v_scale
        )
        assert (out.double() - ref).abs().max() < 4e-3


def test_markdown_reports_bandwidth_and_the_ratio_to_fp16():
    rows = [
        {"shape": [32, 8, 1, 131072], "cache": "fp16", "config": "gluon 64/4", "splits": 64, "us": 100.0,
         "bytes": 512 * 2**20},
        {"shape": [32, 8, 1, 131072], "cache": "fp8", "config": "64/4/3", "splits": 64, "us": 50.0,
         "bytes": 256 * 2**20},
    ]  # fmt: skip
    text = markdown(result(rounds=5, copy_gbs=4000.0, rows=rows))
    lines = text.splitlines()
    table_at(lines, "| q/kv heads", 2)
    assert "| 32/8 | 1 | 131072 | fp8 | 64/4/3 | 64 | 50.0 | 256.0 | 5369 | 1.34 | 2.00x |" in text
    assert "| 32/8 | 1 | 131072 | fp16 | gluon 64/4 | 64 | 100.0 | 512.0 | 5369 | 1.34 | 1.00x |" in text


def test_a_given_config_runs_at_the_plans_split_count():
    inputs = quantized_inputs("int8", 4, 2, 2, 48, "cpu", head_dim=64, sets=1)
    q, k_cache, v_cache, k_scale, v_scale, tables, seq_lens = inputs
    _, planned_splits, _ = decode_calls("int8", inputs, get_device_info())
    config = DecodeConfig(16, 4, 1, 1)
    calls, splits, used = decode_calls("int8", inputs, get_device_info(), config)
    assert (splits, used) == (planned_splits, config)
    ref = reference.paged_decode_attention(
        q.double(), k_cache, v_cache, tables[0], seq_lens, 64**-0.5, k_scale=k_scale, v_scale=v_scale
    )
    assert (calls[0]().double() - ref).abs().max() < 4e-3


def test_sweep_markdown_lists_the_fastest_and_the_plan():
    rows = [{"shape": [32, 32, 128, 512], "cache": "fp8", "config": f"{n}/4/3", "splits": 1, "us": float(n),
             "bytes": 512 * 2**20} for n in (10, 20, 30, 40, 50, 60)]  # fmt: skip
    rows.append({"shape": [32, 32, 128, 512], "cache": "fp8", "config": "plan 128/4/4", "splits": 1, "us": 70.0,
                 "bytes": 512 * 2**20})  # fmt: skip
    rows.append({"shape": [32, 32, 128, 512], "cache": "fp8", "config": "256/8/6", "error": "OutOfResources"})
    text = sweep_markdown(result(rounds=5, copy_gbs=4000.0, sweep=rows))
    assert "| 32/32 | 128 | 512 | fp8 | 10/4/3 | 1 | 10.0 |" in text and "| 60/4/3 |" not in text
    assert "| plan 128/4/4 | 1 | 70.0 |" in text and "256/8/6" not in text
