"""CUDA graphs of decode steps, one per batch-size bucket and decode plan, sharing one memory pool.

Decode steps dominate serving time and launch many small kernels; a captured graph
replays them with one launch. Every graph reads the same static input buffers
(ids, positions, slots, seq_lens, block tables sized for max_model_len) and writes
one static output; a step copies its batch into the first rows, pads the rest
(slot -1: no K/V write; seq_len 0: no key attended) and replays the graph of the
smallest bucket that holds it, for the step's longest sequence. The split-k count and
kernel config of decode attention are fixed per graph at capture: the runner's
`decode_plan` for the batch bucket and a context bucket (`context_buckets`, which eager
decode uses too). A bucket's graph is captured once per distinct plan: the context
buckets that plan alike share it.

Why per context: the plan's context bound sets its split count and config. Planned at
max_model_len, a step of short sequences splits as if they were long: on an H200
(2026-12-01, benchmarks/decode_context_plan.py, fp16, heads 32/8) 128 sequences of 1k keys
at a 32k bound split 9 ways and took 163.1 us per layer's attention against 123.3 planned at
1k (unsplit); 64 of 512 keys 87.3 against 33.6 (19 splits against one, packed); one of 1k
5.7 against 5.2.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from llm.engine.context import AttentionMetadata, DecodePlan, use_context

logger = logging.getLogger(__name__)


MIN_CONTEXT_BUCKET = 512  # the shortest context bound a decode plan is made for


def batch_buckets(max_batch: int) -> list[int]:
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch] + list(range(16, max_batch, 16))
    return sorted(set(sizes + [max_batch]))


def context_buckets(max_model_len: int) -> list[int]:
    """The context bounds decode is planned for: powers of two from MIN_CONTEXT_BUCKET below max_model_len, then
    max_model_len."""
    sizes, size = [], MIN_CONTEXT_BUCKET
    while size < max_model_len:
        sizes.append(size)
        size *= 2
    return sizes + [max_model_len]


def context_bucket(buckets: list[int], max_context: int) -> int:
    """The smallest of `buckets` that holds `max_context` keys (the largest where none does)."""
    return next((b for b in buckets if b >= max_context), buckets[-1])


class DecodeGraphs:
    def __init__(self, buckets: list[int], graphs: dict, buffers: dict, capture_s: float = 0.0) -> None:
        self.buckets = buckets
        # batch bucket -> [(the largest context bucket it serves, graph, output)], by context
        self.graphs = graphs
        self.buf = buffers
        self.capture_s = capture_s  # seconds the capture took (the engine's start-up log says it too)

    @property
    def count(self) -> int:
        """How many graphs are held (over every batch bucket and plan)."""
        return sum(map(len, self.graphs.values()))

    def fits(self, batch: int) -> bool:
        return batch <= self.buckets[-1]

    @classmethod
    @torch.inference_mode()
    def capture(
        cls,
        model,
        device,
        buckets: list[int],
        max_blocks: int,
        uses_mrope: bool,
        decode_plan: Callable[[int, int], DecodePlan],
        contexts: list[int],
    ) -> DecodeGraphs | None:
        """Capture one graph per batch bucket and distinct decode_plan(bucket, context) over the context buckets
        `contexts`; None (eager decoding) if the model cannot be captured."""
        max_batch = buckets[-1]
        buf = {
            "input_ids": torch.zeros(max_batch, dtype=torch.long, device=device),
            "positions": torch.zeros((3, max_batch) if uses_mrope else (max_batch,), dtype=torch.long, device=device),
            "slot_mapping": torch.full((max_batch,), -1, dtype=torch.long, device=device),
            "seq_lens": torch.zeros(max_batch, dtype=torch.int32, device=device),
            "block_tables": torch.zeros(max_batch, max_blocks, dtype=torch.int32, device=device),
        }
        graphs: dict[int, list] = {}
        pool = None
        start = time.perf_counter()
        try:
            for bs in reversed(buckets):
                graphs[bs] = []
                for bound, plan in reversed(cls._plans(bs, decode_plan, contexts)):
                    meta = cls._metadata(buf, bs, plan)
                    pos = buf["positions"][..., :bs]
                    with use_context(meta):
                        model(buf["input_ids"][:bs], pos)  # warm-up outside the graph (autotuning, lazy init)
                        torch.cuda.synchronize()
                        graph = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(graph, pool):
                            result = model(buf["input_ids"][:bs], pos)
                    if pool is None:
                        pool = graph.pool()  # the first graph's pool; the others reuse it
                    graphs[bs].insert(0, (bound, graph, result))
                    torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - a model that cannot be captured still runs eagerly
            logger.warning("CUDA graph capture failed (%s: %s); decoding eagerly", type(e).__name__, e)
            return None
        captured = cls(buckets, graphs, buf, time.perf_counter() - start)
        logger.info(
            "captured %d decode CUDA graphs (%d batch buckets up to %d, %d context buckets up to %d) in %.1f s",
            captured.count, len(buckets), max_batch, len(contexts), contexts[-1], captured.capture_s,
        )  # fmt: skip
        return captured

    @staticmethod
    def _plans(bs: int, decode_plan: Callable[[int, int], DecodePlan], contexts: list[int]) -> list:
        """[(the largest context bucket a plan serves, the plan)] of batch bucket `bs`, by context: the buckets
        planned alike merged."""
        plans = []
        for context in contexts:
            plan = decode_plan(bs, context)
            if plans and plans[-1][1] == plan:
                plans[-1] = (context, plan)
            else:
                plans.append((context, plan))
        return plans

    @staticmethod
    def _metadata(buf: dict, bs: int, plan: DecodePlan) -> AttentionMetadata:
        num_splits, decode_config = plan
        return AttentionMetadata(
            is_prefill=False,
            slot_mapping=buf["slot_mapping"][:bs],
            block_tables=buf["block_tables"][:bs],
            seq_lens=buf["seq_lens"][:bs],
            max_seqlen_q=1,
            num_splits=num_splits,
            decode_config=decode_config,
        )

    def replay(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        batch = input_ids.shape[0]
        bs = next(b for b in self.buckets if b >= batch)
        buf = self.buf
        buf["input_ids"][:batch].copy_(input_ids)
        buf["positions"][..., :batch].copy_(positions)
        buf["slot_mapping"][:bs].fill_(-1)
        buf["slot_mapping"][:batch].copy_(meta.slot_mapping)
        buf["seq_lens"][:bs].zero_()
        buf["seq_lens"][:batch].copy_(meta.seq_lens)
        width = meta.block_tables.shape[1]
        buf["block_tables"][:batch, :width].copy_(meta.block_tables)
        graph, out = self.graph_for(bs, meta.max_seqlen_k)
        graph.replay()
        return out[:batch]

    def graph_for(self, bs: int, max_context: int):
        """(graph, output) of batch bucket `bs` for a step whose longest sequence holds `max_context` keys: the one
        captured for the smallest context bucket that holds it (as the runner's decode_plan buckets the step)."""
        _, graph, out = next((g for g in self.graphs[bs] if g[0] >= max_context), self.graphs[bs][-1])
        return graph, out
