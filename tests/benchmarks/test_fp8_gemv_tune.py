"""The FP8 tile sweep's picks (benchmarks/fp8_gemv_tune.py): the fastest candidate per bucket and the row count up
to which the GEMV still beats torch._scaled_mm."""

from __future__ import annotations

import pytest

from benchmarks import fp8_gemv_tune as tune


def sweep_rows(times: dict[int, dict[str, float]]) -> list[dict]:
    """Rows as run() writes them: each shape a quarter of the layer time given per row count and column."""
    out = []
    for name in tune.SHAPES:
        for count, cols in times.items():
            row = {"shape": name, "rows": count, "scaled_mm_us": cols["scaled_mm_us"] / 4}
            row.update({tune.key(f): cols.get(tune.key(f), 999.0) / 4 for f in tune.CANDIDATES[count]})
            out.append(row)
    return out


def times(gemv_64: float, gemv_128: float) -> dict[int, dict[str, float]]:
    return {
        1: {"scaled_mm_us": 150.0, "32/512/4/3/2": 100.0},
        16: {"scaled_mm_us": 150.0, "32/512/4/3/2": 110.0},
        64: {"scaled_mm_us": 150.0, "64/128/4/4/2": gemv_64},
        128: {"scaled_mm_us": 150.0, "64/256/8/3/1": gemv_128},
    }


def test_the_fastest_tiles_per_bucket_and_the_rows_the_gemv_wins():
    picked = tune.pick(sweep_rows(times(gemv_64=120.0, gemv_128=130.0)))
    assert picked == {"FP8_GEMV": [32, 512, 4, 3, 2], "FP8_GEMV_MID": [64, 128, 4, 4, 2],
                      "FP8_GEMV_WIDE": [64, 256, 8, 3, 1], "GEMV_ROWS": 128}  # fmt: skip


@pytest.mark.parametrize(("gemv_64", "gemv_128", "rows"), [(160.0, 130.0, 16), (120.0, 160.0, 64)])
def test_the_gemv_stops_at_the_first_row_count_scaled_mm_wins(gemv_64, gemv_128, rows):
    assert tune.pick(sweep_rows(times(gemv_64, gemv_128)))["GEMV_ROWS"] == rows


def test_apply_puts_the_picks_into_the_tables_the_linear_reads(monkeypatch):
    from vlchat.kernels.ops import fp8_linear

    for name in ("FP8_GEMV", "FP8_GEMV_MID", "FP8_GEMV_WIDE", "GEMV_ROWS"):
        monkeypatch.setattr(fp8_linear, name, getattr(fp8_linear, name))
    tune.apply(tune.pick(sweep_rows(times(gemv_64=120.0, gemv_128=130.0))))
    assert fp8_linear.GEMV_ROWS == 128
    assert fp8_linear.gemv_config(100) == fp8_linear.Fp8GemvConfig(64, 256, 8, 3, 1)
    assert fp8_linear.gemv_config(16) == fp8_linear.Fp8GemvConfig(32, 512, 4, 3, 2)
