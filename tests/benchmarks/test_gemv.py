"""The one-row projection benchmark's report (GPU-free)."""

from benchmarks.gemv import SWEEP, markdown
from tests.benchmarks.tables import result
from vlchat.kernels.ops.linear import gemv_config


def test_markdown_reports_the_ratios_to_cublas_the_best_tile_and_the_floor():
    row = {"shape": "1B o", "n": 2048, "k": 2048, "mb": 8.0, "config": "G", "rel_err": 1e-3, "cublas_us": 6.0,
           "gemv_us": 3.0, "best_config": "B", "best_us": 2.5, "norm_cublas_us": 8.0, "norm_gemv_us": 4.0,
           "read_floor_us": 2.0}  # fmt: skip
    text = markdown(result(pdl=True, rows=[row]))
    assert (
        "| 1B o (2048x2048) | 8 | 6.00 | 3.00 | 2.00x | 2.50 (B) | 1.20 | 8.00 | 4.00 | 2.00x | 2.00 | 0.67 | 0.33 |"
        in text
    )


def test_the_sweep_holds_the_tile_rule_of_every_shape():
    """The sweep's best is only comparable to the rule's tile where the rule's tile is among those swept."""
    for n, k in ((3072, 2048), (2048, 8192), (4096, 11008)):
        assert gemv_config(n, k) in SWEEP
