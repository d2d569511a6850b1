"""The engine start-up benchmark's report (GPU-free)."""

from benchmarks.engine_startup import markdown
from tests.benchmarks.tables import result, table_at


def test_markdown_reports_each_start_and_its_time_per_graph():
    rows = [
        {"max_model_len": 32768, "mode": "per context", "triton_cache": "cold", "ready_s": 61.2, "capture_s": 9.2,
         "graphs": 46},
        {"max_model_len": 4096, "mode": "eager", "triton_cache": "warm", "ready_s": 7.0, "capture_s": 0.0,
         "graphs": 0},
    ]  # fmt: skip
    lines = markdown(result(shape="llama3-8b", max_num_seqs=256, rows=rows)).splitlines()
    assert lines[0] == "# Engine start-up on GPU"
    header = table_at(lines, "| max_model_len |", 2)
    assert lines[header + 2] == "| 32768 | per context | cold | 61.2 | 9.2 | 46 | 0.200 |"
    assert lines[header + 3] == "| 4096 | eager | warm | 7.0 | 0.0 | 0 | - |"
