"""The one place that builds device tensors: loads the model, owns the KV cache, runs steps.

Per step it turns the scheduled sequences into `input_ids`/`positions` plus one
`AttentionMetadata` (llm/engine/context.py), runs the model, computes logits only
for the rows that produce a token (the last row of each sequence whose scheduled
tokens reach its end) and samples. Decode-only steps on CUDA replay a CUDA graph
captured for the next larger batch size (`enforce_eager` turns this off).
All batch tensors are built on the host and copied to the model's device here.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict

import torch

from vlchat.kernels.attention import kv_quant
from vlchat.kernels.device import device_for, get_device_info
from vlchat.llm.config import EngineConfig
from vlchat.llm.engine.context import AttentionMetadata, DecodePlan, reset_context, use_context
from vlchat.llm.engine.cuda_graphs import DecodeGraphs, batch_buckets, context_bucket, context_buckets
from vlchat.llm.engine.piecewise import PiecewiseGraphs
from vlchat.llm.engine.sampler import PendingSample, Sampler, SamplerOutput
from vlchat.llm.engine.sequence import Sequence
from vlchat.llm.engine.transfer import Packed, padded_rows, round_up, to_device
from vlchat.llm.errors import InvalidRequestError, ModelLoadError
from vlchat.llm.inputs import MultiModalPrompt
from vlchat.llm.layers.attention import Attention, set_key_offsets
from vlchat.llm.parallel import agree_min, tp_group
from vlchat.llm.rope import RotaryEmbedding, extend_rope_tables, update_rope_for_length
from vlchat.llm.sampling_params import SamplingParams
from vlchat.llm.weights import load_model, resolve_dtype, vocab_size

logger = logging.getLogger(__name__)

TABLE_WIDTH_MULTIPLE = 16  # block-table width multiple: keeps the row stride in one Triton specialization class
_MM_EMBED_CACHE = 32  # image embeddings kept by content hash (a prompt's chunks reuse them)


class UnsampledStep:
    """A launched step's logits ([len(seqs), vocab] fp32 on the device) waiting to be sampled."""

    __slots__ = ("logits", "seqs")

    def __init__(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        self.logits, self.seqs = logits, seqs


def pick_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise InvalidRequestError("device='cuda' was requested but no CUDA GPU is visible; use device='cpu'")
    return torch.device(name)


def pick_dtype(hf_config, requested: str, device: torch.device, supports_bf16: bool = True) -> torch.dtype:
    """The config's dtype (float32 on CPU for "auto"); bf16 on a GPU without bf16 falls back to fp16 with a warning."""
    if requested == "auto" and device.type == "cpu":
        return torch.float32
    dtype = resolve_dtype(hf_config, requested)
    if device.type == "cuda" and dtype == torch.bfloat16 and not supports_bf16:
        logger.warning("this GPU has no bfloat16 support (compute capability < 8.0); running the model in float16")
        dtype = torch.float16
    return dtype


def _leading_one_token_seqs(seqs: list[Sequence]) -> int:
    n = 0
    while n < len(seqs) and seqs[n].num_new_tokens == 1:
        n += 1
    return n


def _first_token_id(hf_config, eos_token_ids: list[int]) -> int:
    """The token a sequence usually starts with (BOS; the first EOS id where the config names no BOS), whose key
    at position 0 an int4 cache subtracts from every key (layers/attention.py set_key_offsets)."""
    for cfg in (hf_config, hf_config.get_text_config()):
        bos = getattr(cfg, "bos_token_id", None)
        if isinstance(bos, int):
            return bos
    return eos_token_ids[0] if eos_token_ids else 0


def _covers_image(seq: Sequence) -> bool:
    """Some of the sequence's tokens scheduled this step are image rows (their embeddings come from the encoder)."""
    start, end = seq.num_computed_tokens, seq.num_computed_tokens + seq.num_new_tokens
    return any(item.offset < end and item.end > start for item in seq.prompt.images)


class ModelRunner:
    def __init__(self, config: EngineConfig, hf_config, max_model_len: int, eos_token_ids: list[int]) -> None:
        self.device = pick_device(config.device)
        bf16 = self.device.type != "cuda" or get_device_info().supports_bf16
        self.dtype = pick_dtype(hf_config, config.dtype, self.device, bf16)
        self.block_size = config.cache.block_size
        self.kv_cache_dtype = config.cache.kv_cache_dtype
        self.max_model_len = max_model_len
        self.model = load_model(config.model, self.dtype, self.device, progress=False, hf_config=hf_config,
                                random_weights=config.load_format == "dummy",
                                quantization=config.quantization)  # fmt: skip
        self.model_cls = type(self.model)
        extend_rope_tables(self.model, max_model_len)  # an override may exceed the config's length
        self.uses_mrope = bool(getattr(self.model, "uses_mrope", False))
        self.attn_layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        for attn in self.attn_layers:  # a format the model's heads cannot take fails here, before any memory is sized
            try:
                kv_quant.storage_dim(self.kv_cache_dtype, attn.head_dim)
            except kv_quant.KVCacheFormatError as e:
                raise InvalidRequestError(str(e)) from e
        with_scales = sum(any(s is not None for s in a.checkpoint_fp8_scales) for a in self.attn_layers)
        if with_scales and self.kv_cache_dtype == "fp8":
            logger.info("fp8 KV cache with the checkpoint's scales in %d of %d layers (1.0 in the others)",
                        with_scales, len(self.attn_layers))  # fmt: skip
        elif with_scales:
            logger.info("the checkpoint holds FP8 KV cache scales; --kv-cache-dtype fp8 stores the cache with them")
        if self.kv_cache_dtype == "int4":  # every rank runs it: a forward, collective under tensor parallelism
            set_key_offsets(self.model, _first_token_id(hf_config, eos_token_ids), self.uses_mrope)
        self.rope_tracks_length = any(
            isinstance(m, RotaryEmbedding) and m.needs_length_update for m in self.model.modules()
        )
        self.sampler = Sampler(eos_token_ids, vocab_size(hf_config), self.device, seed=config.seed)
        self._mm_cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._sampled_tokens: torch.Tensor | None = None  # the last launched step's tokens, on the device
        self._sampled_rows: dict[int, int] = {}  # seq_id -> row of _sampled_tokens
        if self.device.type == "cuda":
            self._warm_up(config.scheduler.max_num_batched_tokens, config.scheduler.max_num_seqs)
        self.num_blocks = self._num_blocks(config)
        self._allocate_kv_cache()
        self.block_nbytes = self.kv_caches[0][0][0].nbytes  # one block of one layer's keys
        self.max_blocks = math.ceil(max_model_len / self.block_size)
        self.buckets = batch_buckets(min(config.scheduler.max_num_seqs, 512))
        self.context_buckets = context_buckets(max_model_len)
        self._plans: dict[tuple[int, int], DecodePlan] = {}  # (batch bucket, context bucket) -> decode_plan
        self.graphs: DecodeGraphs | None = None
        if self.device.type == "cuda" and not config.enforce_eager:
            self.graphs = DecodeGraphs.capture(
                self.model,
                self.device,
                self.buckets,
                round_up(self.max_blocks, TABLE_WIDTH_MULTIPLE),  # the widest table padded_rows builds
                self.uses_mrope,
                self.decode_plan,
                self.context_buckets,
            )
        self.pieces: PiecewiseGraphs | None = None
        piece_tokens = min(config.piecewise_graph_tokens, config.scheduler.max_num_batched_tokens)
        # steps of a model whose rotary tables change with the length (dynamic NTK, longrope) keep running eagerly:
        # a table rebuilt by a step would not be the one the pieces were captured with
        if self.graphs is not None and piece_tokens and not self.rope_tracks_length and tp_group().size == 1:
            self.pieces = PiecewiseGraphs.capture(self.model, self.attn_layers, self.device, piece_tokens,
                                                  self.uses_mrope)  # fmt: skip
        if self.device.type == "cuda":
            self._compile_step_kernels()

    @torch.inference_mode()
    def _compile_step_kernels(self) -> None:
        """Run scratch steps on scratch blocks, then zero them, so that Triton compiles the eager steps' kernels now
        instead of while the first requests wait: a mixed step (a decode row and a prefill of a few blocks), then a
        prefill of more query tiles than the prefill kernels take heads first (kernels/attention/launch_order.py:
        the other launch order is another compiled variant, and a serving start's first step of many prompts
        takes it)."""
        from vlchat.kernels.attention.launch_order import HEADS_FIRST_MAX_TILES

        bs, n = self.block_size, 2 * self.block_size + 3
        params = SamplingParams(temperature=0, max_tokens=1)

        def scratch(tokens: int, computed: int, first_block: int) -> Sequence:
            seq = Sequence("warm-up", MultiModalPrompt([0] * (computed + tokens)), params, bs)
            seq.block_table = list(range(first_block, first_block + math.ceil((computed + tokens) / bs)))
            seq.num_computed_tokens, seq.num_new_tokens = computed, tokens
            return seq

        steps = [[scratch(1, 1, 0), scratch(n, 0, 1)]]
        per_seq = math.ceil(2 / bs)
        steps.append([scratch(2, 0, i * per_seq) for i in range(HEADS_FIRST_MAX_TILES + 1)])
        used = 0
        for seqs in steps:
            needed = max(s.block_table[-1] for s in seqs) + 1
            if needed > self.num_blocks:
                break
            self.launch(seqs).result()
            used = max(used, needed)
        for cache in (*self.kv_caches, *self.kv_scale_tensors):
            for t in cache:
                t[:used].zero_()

    # -- memory -------------------------------------------------------------

    def block_bytes(self) -> int:
        """Bytes of one block over all layers' K and V caches in the chosen format (int8 scales included)."""
        per_token = sum(
            kv_quant.bytes_per_token(self.kv_cache_dtype, a.num_kv_heads, a.head_dim, self.dtype)
            for a in self.attn_layers
        )
        return per_token * self.block_size

    @torch.inference_mode()
    def _warm_up(self, max_tokens: int, max_seqs: int) -> None:
        """One forward at the token budget (no cache) so the activation peak is known before sizing KV."""
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        tokens = min(max_tokens, self.max_model_len)
        ids = torch.zeros(tokens, dtype=torch.long, device=self.device)
        positions = torch.arange(tokens, device=self.device)
        if self.uses_mrope:
            positions = positions.expand(3, tokens)
        hidden = self.model(ids, positions)
        self.model.compute_logits(hidden[: min(max_seqs, tokens)])
        torch.cuda.synchronize()

    def _num_blocks(self, config: EngineConfig) -> int:
        """The KV pool's size in blocks: the configured count, else what memory allows (under tensor parallelism
        each rank holds its heads' share of every block, and all ranks take the smallest rank's count)."""
        if config.cache.num_blocks is not None:
            return config.cache.num_blocks
        if self.device.type == "cuda":
            activation_peak = torch.cuda.max_memory_allocated() - torch.cuda.memory_allocated()
            torch.cuda.empty_cache()
            free, _ = torch.cuda.mem_get_info()
            budget = free * config.cache.cache_fraction - activation_peak
        else:
            budget = config.cache.cpu_cache_gb * 1e9
        num_blocks = agree_min(int(budget // self.block_bytes()), self.device)
        if num_blocks < 1:
            raise ModelLoadError(
                "no memory is left for the KV cache after loading the model; raise cache_fraction, "
                "lower max_num_batched_tokens or use a smaller dtype"
            )
        return num_blocks

    def _allocate_kv_cache(self) -> None:
        self.kv_caches = []
        self.kv_scale_tensors = []  # the int8 caches' per-token scale/zero tensors, zeroed with the caches
        for attn in self.attn_layers:
            # zeros: padded graph rows read them
            k, v, k_scale, v_scale = kv_quant.allocate(
                self.kv_cache_dtype, self.num_blocks, self.block_size, attn.num_kv_heads, attn.head_dim, self.dtype,
                self.device,
            )  # fmt: skip
            if self.kv_cache_dtype == "fp8":  # the checkpoint's scales where it has them, else 1.0
                k_scale, v_scale = (s if s is not None else 1.0 for s in attn.checkpoint_fp8_scales)
            attn.kv_scales = (k_scale, v_scale)
            attn.kv_cache = (k, v)
            self.kv_caches.append((k, v))
            if isinstance(k_scale, torch.Tensor):
                self.kv_scale_tensors.append((k_scale, v_scale))

    # -- one step -----------------------------------------------------------

    def decode_plan(self, batch: int, max_context: int | None = None) -> DecodePlan:
        """(split count, kernel config) of decode attention for a batch whose longest sequence holds `max_context`
        keys (default max_model_len): the kernel's plan at the batch's graph bucket and the context bucket that
        holds it (cuda_graphs.context_buckets), so eager and graph decode split alike and run the config the count
        was planned for (an eager step's own block table would otherwise re-plan and may move a one-wave count
        onto another config). (None, None) on CPU (unused there)."""
        if self.device.type != "cuda":
            return None, None
        bucket = next((b for b in self.buckets if b >= batch), batch)
        context = context_bucket(self.context_buckets, max_context or self.context_buckets[-1])
        if (bucket, context) not in self._plans:
            from vlchat.kernels.attention import plan

            attn, k_cache = self.attn_layers[0], self.kv_caches[0][0]
            self._plans[bucket, context] = plan.bound_plan(
                bucket, attn.num_heads, k_cache.shape[2], attn.head_dim, self.dtype, self.block_size, context,
                device_for(k_cache), cache_dtype=k_cache.dtype, cache_width=k_cache.shape[-1],
            )  # fmt: skip
        return self._plans[bucket, context]

    def _positions(self, seq: Sequence, start: int, end: int) -> list[int] | list[list[int]]:
        if not self.uses_mrope:
            return list(range(start, end))
        mrope = seq.prompt.mrope_positions
        prompt_end = min(end, seq.num_prompt_tokens) if mrope is not None else start
        head = mrope[:, start:prompt_end].tolist() if prompt_end > start else [[], [], []]
        tail = [p + seq.prompt.mrope_delta for p in range(max(start, prompt_end), end)]
        return [h + tail for h in head]

    def _prepare(self, seqs: list[Sequence], bucket: int | None = None):
        """The step's inputs on the device: (input_ids, positions, metadata, sample rows or None where every row
        samples). `bucket`: a decode step replayed from the CUDA graph of that batch bucket; its inputs are padded to
        the bucket (slot -1, seq_len 0) and land in the graphs' static buffers, and the metadata is their views."""
        input_ids, slots, seq_lens, cu_q, sample_rows = [], [], [], [0], []
        # tokens the previous step sampled, still on the device: their input rows, their rows there
        fill_rows, fill_src = [], []
        positions: list = [[], [], []] if self.uses_mrope else []
        bs = self.block_size
        mrope = self.uses_mrope
        for seq in seqs:
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + seq.num_new_tokens
            if end > len(seq.token_ids):  # its last token is still on the device (async scheduling)
                fill_rows.append(len(input_ids) + end - start - 1)
                fill_src.append(self._sampled_rows[seq.seq_id])
            if end - start == 1 and not mrope:  # a decode row: the common case, kept lean
                input_ids.append(seq.token_ids[start] if start < len(seq.token_ids) else 0)
                positions.append(start)
                slots.append(seq.block_table[start // bs] * bs + start % bs)
            else:
                known = seq.token_ids[start:end]
                input_ids.extend(known + [0] * (end - start - len(known)))  # 0: filled from the device below
                pos = self._positions(seq, start, end)
                if mrope:
                    for axis in range(3):
                        positions[axis].extend(pos[axis])
                else:
                    positions.extend(pos)
                slots.extend(seq.block_table[p // bs] * bs + p % bs for p in range(start, end))
            seq_lens.append(end)
            cu_q.append(cu_q[-1] + end - start)
            if seq.samples_this_step:
                sample_rows.append(cu_q[-1] - 1)
        tables = padded_rows([s.block_table_array() for s in seqs], multiple=TABLE_WIDTH_MULTIPLE)
        max_q = max(s.num_new_tokens for s in seqs)
        is_prefill = max_q > 1
        num_decode = _leading_one_token_seqs(seqs) if is_prefill else 0
        decode_rows = num_decode if is_prefill else len(seqs)  # the rows that run on the split-k decode kernel
        max_seqlen_k = max(seq_lens)
        # planned for the decode rows' longest sequence (its context bucket), as the step's graph was captured
        num_splits, decode_config = (
            self.decode_plan(decode_rows, max(seq_lens[:decode_rows])) if decode_rows else (None, None)
        )
        if len(sample_rows) == cu_q[-1]:
            sample_rows = None  # every row samples (a decode step): the hidden states need no gather
        pad = (bucket or 0) - len(seqs)
        if pad > 0:  # padded rows write no K/V and attend to no key
            input_ids += [0] * pad
            positions = [axis + [0] * pad for axis in positions] if mrope else positions + [0] * pad
            slots += [-1] * pad
            seq_lens += [0] * pad
        # one copy per dtype (llm/engine/transfer.py), in the order cuda_graphs.static_inputs reads
        longs = Packed([input_ids, positions, slots, fill_rows, fill_src], torch.long, self.device)
        ints = Packed([seq_lens, tables, cu_q], torch.int32, self.device)
        if bucket is None:
            ids, pos, slot_mapping, dst, src = longs.to()
            seq_lens_dev, tables_dev, cu_q_dev = ints.to()
        else:
            ids, pos, slot_mapping, dst, src = longs.to(self.graphs.buf["longs"])
            seq_lens_dev, compact, cu_q_dev = ints.to(self.graphs.buf["ints"])
            seq_lens_dev = seq_lens_dev[: len(seqs)]  # the metadata describes the step's own rows
            tables_dev = self.graphs.buf["block_tables"][: len(seqs)]
            tables_dev[:, : compact.shape[1]].copy_(compact)
        if fill_rows:
            ids.index_copy_(0, dst, self._sampled_tokens.index_select(0, src))
        meta = AttentionMetadata(
            is_prefill=is_prefill,
            slot_mapping=slot_mapping,
            block_tables=tables_dev,
            seq_lens=seq_lens_dev,
            cu_seqlens_q=cu_q_dev,
            max_seqlen_q=max_q,
            max_seqlen_k=max_seqlen_k,
            # decode rows of a mixed step split like a decode step of their count (one plan lookup per step)
            num_splits=num_splits,
            decode_config=decode_config,
            num_decode_seqs=num_decode,
        )
        return ids, pos, meta, sample_rows

    def _mm_embeds(self, seqs: list[Sequence], input_ids: torch.Tensor) -> torch.Tensor | None:
        """inputs_embeds with image rows replaced, or None when no scheduled chunk covers an image."""
        spans = []  # (row in this batch, image, first image row, count)
        row = 0
        for seq in seqs:
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + seq.num_new_tokens
            for item in seq.prompt.images:
                lo, hi = max(start, item.offset), min(end, item.end)
                if lo < hi:
                    spans.append((row + lo - start, item, lo - item.offset, hi - lo))
            row += end - start
        if not spans:
            return None
        missing = list({item.hash: item for _, item, _, _ in spans if item.hash not in self._mm_cache}.values())
        if missing:
            for item, emb in zip(missing, self.model.embed_multimodal([m.data for m in missing]), strict=True):
                self._mm_cache[item.hash] = emb
        embeds = self.model.get_input_embeddings(input_ids).clone()  # [tokens, hidden]
        for dst, item, src, count in spans:
            self._mm_cache.move_to_end(item.hash)
            embeds[dst : dst + count] = self._mm_cache[item.hash][src : src + count].to(embeds.dtype)
        while len(self._mm_cache) > _MM_EMBED_CACHE:
            self._mm_cache.popitem(last=False)
        return embeds

    def run(self, seqs: list[Sequence]) -> SamplerOutput:
        """Run one step over `seqs` (their num_new_tokens set) and sample for the rows that end a sequence."""
        return self.launch(seqs).result()

    @torch.inference_mode()
    def launch(self, seqs: list[Sequence], sample: bool = True) -> PendingSample | UnsampledStep:
        """`run` without waiting: the forward pass and sampling are queued on the device.

        `sample=False`: only the forward pass and the logits are queued; `sample(step)` queues the sampling later
        (the engine does so for grammar-constrained rows once their matchers have consumed the previous token)."""
        graphs = self.graphs
        replay = (
            graphs is not None and graphs.fits(len(seqs)) and all(s.num_new_tokens == 1 for s in seqs)
            and not any(_covers_image(s) for s in seqs if s.prompt.images)
        )  # fmt: skip
        bucket = graphs.bucket(len(seqs)) if replay else None
        input_ids, positions, meta, sample_rows = self._prepare(seqs, bucket)
        if self.rope_tracks_length:  # dynamic NTK / longrope rescale with the longest sequence
            update_rope_for_length(self.model, meta.max_seqlen_k)
        if replay:
            hidden = graphs.replay(bucket, meta.max_seqlen_k)[: len(seqs)]
        elif self.pieces is not None and self.pieces.fits(len(input_ids)) and not any(
            _covers_image(s) for s in seqs if s.prompt.images
        ):
            with use_context(meta):
                hidden = self.pieces.run(input_ids, positions)
        else:
            embeds = self._mm_embeds(seqs, input_ids) if any(s.prompt.images for s in seqs) else None
            with use_context(meta):
                hidden = self.model(input_ids, positions, inputs_embeds=embeds) if embeds is not None else (
                    self.model(input_ids, positions))  # fmt: skip
        samplers = [s for s in seqs if s.samples_this_step]
        if not samplers:
            return PendingSample(None, None, [])
        if sample_rows is not None:
            hidden = hidden.index_select(0, to_device(sample_rows, torch.long, hidden.device))
        logits = self.model.compute_logits(hidden)  # [samplers, vocab] fp32
        step = UnsampledStep(logits, samplers)
        return self.sample(step) if sample else step

    @torch.inference_mode()
    def sample(self, step: UnsampledStep) -> PendingSample:
        pending = self.sampler.sample(step.logits, step.seqs)
        # the next step may start before these tokens reach the host: it reads them from here
        self._sampled_tokens, self._sampled_rows = pending.tokens, {s.seq_id: i for i, s in enumerate(step.seqs)}
        return pending

    def sampled_state(self) -> tuple:
        """The last launched step's tokens on the device, which the next step's fill rows read (async scheduling)."""
        return self._sampled_tokens, self._sampled_rows

    def restore_sampled_state(self, state: tuple) -> None:
        self._sampled_tokens, self._sampled_rows = state

    def adopt_sampled(self, samplers: list[Sequence], token_ids: list[int]) -> None:
        """Make `token_ids` (one per sampler) the last launched step's tokens: a step that ran in parts."""
        self._sampled_tokens = to_device(token_ids or [0], torch.long, self.device)
        self._sampled_rows = {s.seq_id: i for i, s in enumerate(samplers)}

    def close(self) -> None:
        reset_context()
        for attn in self.attn_layers:
            attn.kv_cache = None
            attn.kv_scales = (None, None)
        self.kv_caches = []
        self.kv_scale_tensors = []
        self.graphs = None
