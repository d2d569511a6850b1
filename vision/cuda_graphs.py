"""CUDA graphs for the vision towers: one graph per input signature (image count and sizes).

A tower forward is hundreds of small kernels for one image; replaying a captured
graph removes their launch cost. Graphs share one memory pool and are kept for
the most recent `max_graphs` signatures. Outputs are cloned out of the graph's
static buffers, so a later replay never overwrites what a caller holds.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable

import torch


class _Entry:
    __slots__ = ("graph", "inputs", "output")

    def __init__(self, graph, inputs, output) -> None:
        self.graph, self.inputs, self.output = graph, inputs, output


class GraphCache:
    """`cache.run(key, fn, *tensors)` = `fn(*tensors)`, captured on the first call for each `key` (CUDA only).

    For one key, `fn` must be a pure function of its tensor inputs (no host syncs; the key fixes
    every shape and every host value it uses) returning one tensor.

    Args:
        max_graphs: graphs kept (least recently used dropped first).
        min_uses: a key is captured on its `min_uses`-th call and runs eagerly before that; towers
            whose inputs take many sizes (Qwen's native resolution) capture only sizes that recur.
    """

    def __init__(self, max_graphs: int = 16, min_uses: int = 1) -> None:
        if max_graphs < 1 or min_uses < 1:
            raise ValueError(f"max_graphs and min_uses must be >= 1, got {max_graphs}, {min_uses}")
        self.max_graphs = max_graphs
        self.min_uses = min_uses
        self.entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self.seen: OrderedDict[Hashable, int] = OrderedDict()
        self.pool = None

    def run(self, key: Hashable, fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> torch.Tensor:
        entry = self.entries.get(key)
        if entry is None:
            uses = self.seen.pop(key, 0) + 1
            if uses < self.min_uses:
                self.seen[key] = uses
                while len(self.seen) > 4 * self.max_graphs:
                    self.seen.popitem(last=False)
                return fn(*inputs)
            entry = self._capture(fn, inputs)
            self.entries[key] = entry
            while len(self.entries) > self.max_graphs:
                self.entries.popitem(last=False)
        self.entries.move_to_end(key)
        with torch.inference_mode():  # the static buffers were made under inference mode
            for static, x in zip(entry.inputs, inputs, strict=True):
                static.copy_(x)
            entry.graph.replay()
            return entry.output.clone()

    @torch.inference_mode()
    def _capture(self, fn, inputs) -> _Entry:
        static = [x.clone() for x in inputs]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn(*static)  # warm-up: Triton compiles and autotunes outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            output = fn(*static)
        return _Entry(graph, static, output)


def can_graph(x: torch.Tensor) -> bool:
    """Whether a vision forward on `x` may be captured: on a GPU, and not inside another capture."""
    return x.is_cuda and not torch.cuda.is_current_stream_capturing()
