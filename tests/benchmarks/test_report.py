"""Where the benchmarks write their results (GPU-free)."""

import json
import os

from benchmarks.report import add_row, device_header, result_stem, results_parser, save_results


def test_results_go_to_one_stem_per_benchmark_and_device(tmp_path):
    stem = result_stem(tmp_path / "results", "decode_floor", "NVIDIA H200")
    assert stem == os.path.join(tmp_path / "results", "decode_floor_NVIDIA_H200")
    save_results(stem, {"device": "NVIDIA H200"}, lambda res: f"# {res['device']}\n")
    assert json.loads((tmp_path / "results" / "decode_floor_NVIDIA_H200.json").read_text()) == {"device": "NVIDIA H200"}
    assert (tmp_path / "results" / "decode_floor_NVIDIA_H200.md").read_text() == "# NVIDIA H200\n"


def test_a_kernel_benchmark_result_starts_with_the_device_and_the_versions():
    from vlchat.kernels.device import DeviceInfo, TritonMode

    device = DeviceInfo("cuda", "NVIDIA H200", (9, 0), 132, 227 << 10, 141 << 30, True, TritonMode.COMPILED)
    header = device_header(device)
    assert (header["device"], header["arch"], header["sm_count"]) == ("NVIDIA H200", "sm_90", 132)
    assert {"date", "torch", "triton", "python"} <= header.keys()


def test_a_benchmark_parser_takes_out_and_describes_itself_by_its_first_doc_line():
    parser = results_parser("Decode at short contexts.\n\nMore text.")
    assert parser.description == "Decode at short contexts."
    assert parser.parse_args([]).out == "benchmarks/results"
    parser.add_argument("--head-dim", type=int, default=256)
    args = parser.parse_args(["--out", "/tmp/x", "--head-dim", "128"])
    assert (args.out, args.head_dim) == ("/tmp/x", 128)
    assert results_parser().description is None


def test_add_row_keeps_the_row_and_prints_its_line_of_the_report(capsys):
    res = {"name": "sweep", "rows": [{"x": 1}]}

    def render(r):
        return "\n".join([f"# {r['name']}", "| x |", *(f"| {row['x']} |" for row in r["rows"])])

    add_row(res, {"x": 2}, render)
    assert res["rows"] == [{"x": 1}, {"x": 2}]
    assert capsys.readouterr().out == "| 2 |\n"
