"""Where every benchmark's results go: `<stem>.json`, and `<stem>.md` rendered from it (also printed)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
from collections.abc import Callable
from pathlib import Path


def results_parser(doc: str | None = None) -> argparse.ArgumentParser:
    """A benchmark's argument parser with `--out DIR`, where its results go (default benchmarks/results), described
    by the first line of `doc`; the benchmark adds its own arguments."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    parser.add_argument("--out", default="benchmarks/results")
    return parser


def versions(transformers: bool = False) -> dict:
    """What every GPU result names besides its device: the UTC time of the run and the versions of Python, torch
    and Triton (and transformers, where the benchmark compares with it)."""
    import torch
    import triton

    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version()}  # fmt: skip
    if transformers:
        import transformers as hf

        res["transformers"] = hf.__version__
    return res


def cpu_name() -> str:
    """The processor's model name (from /proc/cpuinfo; else what `platform` knows): a CPU result's device."""
    info = Path("/proc/cpuinfo")
    for line in info.read_text().splitlines() if info.exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def device_header(device) -> dict:
    """What a kernel benchmark's result starts with: the device (a DeviceInfo: name, arch, SM count), then
    `versions`."""
    return {"device": device.name, "arch": device.arch, "sm_count": device.sm_count, **versions()}


def versions_line(res: dict) -> str:
    """The Markdown header line of what `versions` recorded in a result: the date, then the versions."""
    names = ["torch", "triton", "transformers", "python"]
    return f"{res['date']}; " + ", ".join(f"{name} {res[name]}" for name in names if name in res)


def result_stem(out: str | os.PathLike, name: str, device: str) -> str:
    """`out`/`name`_`device`, the device's spaces as underscores: where a GPU benchmark's results go."""
    return os.path.join(out, f"{name}_{device.replace(' ', '_')}")


def save_results(stem: str | os.PathLike, result: dict, render: Callable[[dict], str] | None = None) -> None:
    """Write `stem`.json (creating its folder); with `render`, then `stem`.md (render_results). The JSON is
    written first, so a partial result survives a failing or interrupted render."""
    stem = os.fspath(stem)
    os.makedirs(os.path.dirname(stem) or ".", exist_ok=True)
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    if render is not None:
        render_results(stem, result, render)


def render_results(stem: str | os.PathLike, result: dict, render: Callable[[dict], str]) -> None:
    """Write `stem`.md = render(result) and print it."""
    text = render(result)
    with open(os.fspath(stem) + ".md", "w") as f:
        f.write(text)
    print(text)


def add_row(result: dict, row: dict, render: Callable[[dict], str]) -> None:
    """Append `row` to result["rows"] and print its line of the report (the last line `render` gives for a result
    of that row alone): progress while a long sweep runs."""
    result["rows"].append(row)
    print(render({**result, "rows": [row]}).splitlines()[-1], flush=True)
