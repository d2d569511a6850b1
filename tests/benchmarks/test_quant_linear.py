"""The W4A16 benchmark's memory model and report (GPU-free)."""

import pytest

from benchmarks.quant_linear import (
    FORMATS,
    MODELS,
    SHAPES,
    layer_rows,
    markdown,
    memory_table,
    model_bytes,
    pick_gemv,
    w4_bytes,
)
from tests.benchmarks.tables import result, table_at


def test_weight_bytes_of_the_llama_shapes():
    assert model_bytes("7B", "fp16") == pytest.approx(2 * 6.738e9, rel=1e-3)  # Llama 2 7B: 6.74B parameters
    assert model_bytes("13B", "fp16") == pytest.approx(2 * 13.016e9, rel=1e-3)
    # 4096 x 4096 at group 128: 8 MiB of codes, 32 x 4096 fp16 scales, as many uint8 zeros
    assert w4_bytes(4096, 4096, 128) == 8 * 2**20 + 32 * 4096 * 3
    assert w4_bytes(4096, 4096, 128, zeros=False) == 8 * 2**20 + 32 * 4096 * 2
    ratio = model_bytes("7B", "w4a16-g128") / model_bytes("7B", "fp16")
    assert 0.28 < ratio < 0.30  # the fp16 embeddings and head keep it above a quarter
    assert model_bytes("7B", "w4a16-g32") > model_bytes("7B", "w4a16-g64") > model_bytes("7B", "w4a16-g128")


def test_markdown_sums_the_layer_and_lists_every_projection():
    rows = [
        {"shape": name, "n": n, "k": k, "rows": count, "fp16_us": 10.0, "w4_us": 4.0, "read_floor_us": 3.0,
         "quant_mb": 1.0, "rel_err": 1e-3, "fp8_us": 5.0 if count == 1 else None,
         "fp8_floor_us": 4.0 if count == 1 else None, "fp8_gemv_us": 5.0 if count == 1 else None,
         "fp8_mm_us": 8.0 if count == 1 else None, "w4_dot_us": None}
        for name, (n, k) in SHAPES.items() for count in (1, 128)
    ]  # fmt: skip
    assert layer_rows(rows) == [
        {"rows": 1, "fp16_us": 40.0, "w4_us": 16.0, "read_floor_us": 12.0, "w4_dot_us": None, "fp8_us": 20.0,
         "fp8_floor_us": 16.0, "fp8_gemv_us": 20.0, "fp8_mm_us": 32.0},
        {"rows": 128, "fp16_us": 40.0, "w4_us": 16.0, "read_floor_us": 12.0, "w4_dot_us": None, "fp8_us": None,
         "fp8_floor_us": None, "fp8_gemv_us": None, "fp8_mm_us": None},
    ]
    lines = markdown(result(group=128, memory=memory_table(), rows=rows)).splitlines()
    assert lines[0] == "# W4A16 projections (Llama 2 7B layer) on GPU"
    layer = table_at(lines, "| rows |", 2)
    assert lines[layer + 2] == "| 1 | 40.0 | 16.0 | 2.50x | 12.0 | 0.75 | 20.0 | 2.00x | 16.0 | 0.80 | 20.0 | 32.0 | - |"
    assert lines[layer + 3].endswith("| 0.75 | - | - | - | - | - | - | - |")  # no FP8 tensor cores
    memory = table_at(lines, "| model |", len(MODELS))
    assert lines[memory].count("|") == len(FORMATS) + 2 and lines[memory + 2].startswith("| 7B | 13.48 GB |")
    per = table_at(lines, "| W |", len(rows))
    assert "| 0.75 | 5.00 |" in lines[per + 2] and "| 0.75 | - |" in lines[per + 3]


def _swept(rows, dot, block_n, layer_us):
    fields = {"block_n": block_n, "block_k": 64, "num_warps": 4, "waves": 4, "dot": dot, "tf32": False}
    return {"rows": rows, "fields": fields, "layer_us": layer_us}


def test_the_sweep_picks_the_fastest_product_per_row_count():
    rows = [_swept(1, False, 128, 50.0), _swept(1, False, 64, 60.0), _swept(1, True, 64, 90.0),
            _swept(2, False, 128, 80.0), _swept(2, True, 64, 90.0), _swept(4, False, 64, 95.0),
            _swept(4, True, 64, 91.0), _swept(16, True, 64, 100.0), _swept(16, True, 128, 98.0)]  # fmt: skip
    picked = pick_gemv(rows)
    assert picked["gemv_cores"]["block_n"] == 128 and not picked["gemv_cores"]["dot"] and picked["gemv_pairs"] is None
    pairs = dict(_swept(1, False, 512, 40.0), fields={**_swept(1, False, 512, 40.0)["fields"], "pairs": True})
    both = pick_gemv([pairs, *rows])
    assert both["gemv_pairs"]["block_n"] == 512 and both["gemv_cores"] == picked["gemv_cores"]
    assert picked["gemv_dot"]["block_n"] == 128 and picked["gemv_dot"]["dot"]
    assert picked["dot_rows"] == 4  # tl.dot first wins at four rows; 64 products a row slot fit up to 4 slots
    rows[0]["fields"]["block_k"] = 256  # 256 products a row slot: two rows (two slots) would spill
    assert pick_gemv(rows)["dot_rows"] == 2
