"""CUDA graphs of decode steps, one per batch-size bucket, sharing one memory pool.

Decode steps dominate serving time and launch many small kernels; a captured graph
replays them with one launch. Every graph reads the same static input buffers
(ids, positions, slots, seq_lens, block tables sized for max_model_len) and writes
one static output; a step copies its batch into the first rows, pads the rest
(slot -1: no K/V write; seq_len 0: no key attended) and replays the graph of the
smallest bucket that holds it. The split-k count and kernel config of decode
attention are fixed per bucket at capture (the runner's `decode_plan`, which
eager decode uses too).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from llm.engine.context import AttentionMetadata, DecodePlan, use_context

logger = logging.getLogger(__name__)


def batch_buckets(max_batch: int) -> list[int]:
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch] + list(range(16, max_batch, 16))
    return sorted(set(sizes + [max_batch]))


class DecodeGraphs:
    def __init__(self, buckets: list[int], graphs: dict, buffers: dict) -> None:
        self.buckets = buckets
        self.graphs = graphs
        self.buf = buffers

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
        decode_plan: Callable[[int], DecodePlan],
    ) -> DecodeGraphs | None:
        """Capture one graph per batch bucket; None (eager decoding) if the model cannot be captured."""
        max_batch = buckets[-1]
        buf = {
            "input_ids": torch.zeros(max_batch, dtype=torch.long, device=device),
            "positions": torch.zeros((3, max_batch) if uses_mrope else (max_batch,), dtype=torch.long, device=device),
            "slot_mapping": torch.full((max_batch,), -1, dtype=torch.long, device=device),
            "seq_lens": torch.zeros(max_batch, dtype=torch.int32, device=device),
            "block_tables": torch.zeros(max_batch, max_blocks, dtype=torch.int32, device=device),
        }
        graphs: dict[int, torch.cuda.CUDAGraph] = {}
        pool = None
        try:
            for bs in reversed(buckets):
                meta = cls._metadata(buf, bs, decode_plan(bs))
                pos = buf["positions"][..., :bs]
                with use_context(meta):
                    model(buf["input_ids"][:bs], pos)  # warm-up outside the graph (autotuning, lazy init)
                    torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool):
                        result = model(buf["input_ids"][:bs], pos)
                if pool is None:
                    pool = graph.pool()  # the largest bucket's pool; the smaller graphs reuse it
                graphs[bs] = (graph, result)
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - a model that cannot be captured still runs eagerly
            logger.warning("CUDA graph capture failed (%s: %s); decoding eagerly", type(e).__name__, e)
            return None
        return cls(buckets, graphs, buf)

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
        graph, out = self.graphs[bs]
        graph.replay()
        return out[:batch]
