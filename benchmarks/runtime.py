"""Where the model benchmarks run: their shared `--out`/`--tiny` arguments, and the GPU sync around timings."""

from __future__ import annotations

import argparse

import torch

from benchmarks.report import results_parser


def tiny_or_gpu_args(add_arguments=None) -> tuple[argparse.Namespace, bool, torch.device]:
    """`--out DIR` and `--tiny` (a CPU check of the script with a tiny model, also taken when there is no GPU), and
    what `add_arguments(parser)` adds: (args, tiny, device)."""
    ap = results_parser()
    ap.add_argument("--tiny", action="store_true", help="CPU check of the script with a tiny model")
    if add_arguments is not None:
        add_arguments(ap)
    args = ap.parse_args()
    tiny = args.tiny or not torch.cuda.is_available()
    return args, tiny, torch.device("cpu" if tiny else "cuda")


def sync() -> None:
    """Wait for the GPU's queued work (nothing to wait for without one), so a host timer measures it."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
