"""CUDA graphs of decode steps, one per batch-size bucket and decode plan, sharing one memory pool.

Decode steps dominate serving time and launch many small kernels; a captured graph
replays them with one launch. Every graph reads the same static input buffers and
writes one static output: two packed buffers (`static_inputs`: ids, positions and
slots; seq_lens), into which the runner copies a step's inputs padded to the bucket
(slot -1: no K/V write; seq_len 0: no key attended) with one copy each, and block
tables sized for max_model_len. A step replays the graph of the smallest bucket that
holds its batch, for the step's longest sequence. The split-k count and
kernel config of decode attention are fixed per graph at capture: the runner's
`decode_plan` for the batch bucket and a context bucket (`context_buckets`, which eager
decode uses too). A bucket's graph is captured once per distinct plan: the context
buckets that plan alike share it.

Why per context: the plan's context bound sets its split count and config. Planned at
max_model_len, a step of short sequences splits as if they were long, and takes up to
2.6x the time (benchmarks/decode_context_plan.py; docs/PERF.md#engine-and-host).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from vlchat.llm.engine.context import AttentionMetadata, DecodePlan, use_context
from vlchat.llm.engine.transfer import Packed

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

    def bucket(self, batch: int) -> int:
        """The smallest batch bucket that holds `batch` rows."""
        return next(b for b in self.buckets if b >= batch)

    @staticmethod
    def static_buffers(max_batch: int, max_blocks: int, uses_mrope: bool, device) -> dict[str, torch.Tensor]:
        """The graphs' input buffers: room for the largest step's packed parts (longs: ids, positions, slots, fill
        rows, fill sources; ints: seq_lens, block tables as the step builds them, cu_seqlens) and the block tables
        the graphs read."""
        longs = Packed.layout([max_batch, 3 * max_batch if uses_mrope else max_batch] + [max_batch] * 3)[-1]
        ints = Packed.layout([max_batch, max_batch * max_blocks, max_batch + 1])[-1]
        return {
            "longs": torch.zeros(longs, dtype=torch.long, device=device),
            "ints": torch.zeros(ints, dtype=torch.int32, device=device),
            "block_tables": torch.zeros(max_batch, max_blocks, dtype=torch.int32, device=device),
        }

    @staticmethod
    def static_inputs(buf: dict, bs: int, uses_mrope: bool) -> tuple[torch.Tensor, ...]:
        """(input_ids, positions, slot_mapping, seq_lens) of batch bucket `bs`: views at the front of the packed
        buffers where the runner's step of `bs` rows puts them (llm/engine/model_runner.py `_prepare`: `Packed` of
        [ids, positions, slots, ...] and of [seq_lens, ...])."""
        pos_size = 3 * bs if uses_mrope else bs
        ids, pos, slots, _ = Packed.layout([bs, pos_size, bs])
        longs = buf["longs"]
        positions = longs[pos : pos + pos_size].view((3, bs) if uses_mrope else (bs,))
        return longs[ids : ids + bs], positions, longs[slots : slots + bs], buf["ints"][:bs]

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
        buf = cls.static_buffers(max_batch, max_blocks, uses_mrope, device)
        graphs: dict[int, list] = {}
        pool = None
        start = time.perf_counter()
        try:
            for bs in reversed(buckets):
                graphs[bs] = []
                ids, pos, slots, seq_lens = cls.static_inputs(buf, bs, uses_mrope)
                slots.fill_(-1)  # the warm-up below writes no K/V
                seq_lens.zero_()
                for bound, plan in reversed(cls._plans(bs, decode_plan, contexts)):
                    meta = cls._metadata(slots, buf["block_tables"][:bs], seq_lens, plan)
                    with use_context(meta):
                        model(ids, pos)  # warm-up outside the graph (autotuning, lazy init)
                        torch.cuda.synchronize()
                        graph = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(graph, pool):
                            result = model(ids, pos)
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
    def _metadata(slots: torch.Tensor, tables: torch.Tensor, seq_lens: torch.Tensor, plan: DecodePlan):
        num_splits, decode_config = plan
        return AttentionMetadata(
            is_prefill=False,
            slot_mapping=slots,
            block_tables=tables,
            seq_lens=seq_lens,
            max_seqlen_q=1,
            num_splits=num_splits,
            decode_config=decode_config,
        )

    def replay(self, bs: int, max_context: int) -> torch.Tensor:
        """Replay bucket `bs`'s graph for a step whose inputs are in the static buffers; its output ([bs, hidden])."""
        graph, out = self.graph_for(bs, max_context)
        graph.replay()
        return out

    def graph_for(self, bs: int, max_context: int):
        """(graph, output) of batch bucket `bs` for a step whose longest sequence holds `max_context` keys: the one
        captured for the smallest context bucket that holds it (as the runner's decode_plan buckets the step)."""
        _, graph, out = next((g for g in self.graphs[bs] if g[0] >= max_context), self.graphs[bs][-1])
        return graph, out
