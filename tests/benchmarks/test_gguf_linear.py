"""The GGUF projection benchmark's report (GPU-free)."""

from benchmarks.gguf_linear import ROWS, TYPES, markdown
from benchmarks.quant_linear import SHAPES
from tests.benchmarks.tables import result, table_at


def test_markdown_lists_every_projection_type_and_row_count():
    rows = [
        {"shape": name, "n": n, "k": k, "type": t, "rows": count, "mb": 4.5, "fp16_us": 10.0, "dequant_us": 6.0,
         "gguf_us": 20.0}
        for name, (n, k) in SHAPES.items() for t in TYPES for count in ROWS
    ]  # fmt: skip
    lines = markdown(result(rows=rows)).splitlines()
    assert lines[0] == "# GGUF projections (Llama 2 7B layer) on GPU"
    at = table_at(lines, "| W |", len(rows))
    assert lines[at + 2] == "| q/k/v (12288x4096) | Q4_K | 1 | 4.5 | 10.0 | 6.0 | 20.0 | 0.50x |"
