"""The step loop: requests in, one scheduled forward pass per `step()`, outputs out.

Not thread-safe: `LLM` drives it from one thread, `AsyncEngine` from its
background thread. Limits are checked when a request is added, never by
silently truncating: prompt + max_tokens must fit `max_model_len`, and the
request's longest sequence must fit in the whole KV pool.
"""

from __future__ import annotations

import logging
import math
import time

from vlchat.kernels import settings as kernel_settings
from vlchat.llm.config import GRAPH_PREFILL_DELAY_STEPS, EngineConfig
from vlchat.llm.engine.block_manager import BlockManager, run_blocks_for
from vlchat.llm.engine.grammar import GrammarCompiler, advance
from vlchat.llm.engine.isolation import launch_isolated
from vlchat.llm.engine.model_runner import ModelRunner
from vlchat.llm.engine.request import Request
from vlchat.llm.engine.scheduler import Scheduler
from vlchat.llm.engine.sequence import Sequence
from vlchat.llm.errors import InvalidRequestError, PromptTooLongError, RequestFailedError, WorkerDiedError
from vlchat.llm.inputs import MultiModalPrompt, encode_text, max_prompt_chars, normalize_prompt
from vlchat.llm.outputs import EngineStats, RequestOutput
from vlchat.llm.sampling_params import SamplingParams
from vlchat.llm.tokenizer import load_tokenizer, stop_token_ids
from vlchat.llm.weights import load_hf_config, vocab_size

logger = logging.getLogger(__name__)


def _max_model_len(hf_config, override: int | None) -> int:
    from vlchat.llm.rope import max_model_len_from_config

    derived = max_model_len_from_config(hf_config)
    if override is None:
        return derived
    if override > derived:
        logger.warning("max_model_len=%d exceeds the %d the model's config supports", override, derived)
    return override


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        if config.kernel_backend is not None:
            kernel_settings.set_backend(config.kernel_backend)
        self.hf_config = load_hf_config(config.model)
        self.tokenizer = load_tokenizer(config.tokenizer)
        self.processor = None  # multimodal models load their HF processor lazily (see _processor)
        self.max_model_len = _max_model_len(self.hf_config, config.max_model_len)
        self.vocab_size = vocab_size(self.hf_config)
        self.eos_token_ids = stop_token_ids(self.tokenizer, config.model, self.hf_config)
        self.max_prompt_chars = max_prompt_chars(self.tokenizer, self.max_model_len)  # text refused untokenized
        sched = config.scheduler
        if not sched.enable_chunked_prefill and sched.max_num_batched_tokens < self.max_model_len:
            sched.max_num_batched_tokens = self.max_model_len  # a whole prompt must fit one step
        if config.tensor_parallel_size > 1:
            from vlchat.llm.engine.workers import WorkerGroup
            from vlchat.llm.models.registry import get_model_class
            from vlchat.llm.parallel import check_shardable

            model_cls = get_model_class(self.hf_config)
            check_shardable(self.hf_config, config.tensor_parallel_size)
            self.runner = WorkerGroup(config, self.max_model_len, self.eos_token_ids, model_cls)
        else:
            self.runner = ModelRunner(config, self.hf_config, self.max_model_len, self.eos_token_ids)
        self.model_cls = self.runner.model_cls
        if config.cache.enable_prefix_caching and self.runner.rope_tracks_length:
            # Dynamic NTK / longrope rotate keys by the longest sequence seen when they were written:
            # a cached block holds keys rotated for another request's length, so it is not reused.
            logger.info("prefix caching is off: the model's RoPE scaling depends on the sequence length")
            config.cache.enable_prefix_caching = False
        self.block_manager = BlockManager(
            self.runner.num_blocks, config.cache.block_size, config.cache.enable_prefix_caching,
            run_blocks_for(self.runner.block_nbytes),
        )  # fmt: skip
        if sched.prefill_delay_steps is None:  # hold prefills only where decode steps are cheap graph replays
            sched.prefill_delay_steps = GRAPH_PREFILL_DELAY_STEPS if self.runner.graphs else 0
        self.scheduler = Scheduler(sched, self.block_manager)
        self.async_scheduling = (
            self.runner.device.type == "cuda" if config.async_scheduling is None else config.async_scheduling
        )
        self.grammars = GrammarCompiler(self.tokenizer, self.vocab_size, self.eos_token_ids)
        self.requests: dict[str, Request] = {}
        self._inflight: tuple[list[Sequence], object] | None = None  # the launched step: (samplers, pending)
        self._touched: dict[str, Request] = {}  # requests with tokens collected but not reported yet
        self._failed: list[RequestFailedError] = []  # requests that failed alone, not handed out yet (take_failures)
        logger.info(
            "engine ready: %s, %s on %s, %d KV blocks of %d tokens (%d tokens, %s KV cache), max_model_len %d",
            config.served_model_name, self.runner.dtype, self.runner.device, self.runner.num_blocks,
            config.cache.block_size, self.kv_cache_tokens, config.cache.kv_cache_dtype, self.max_model_len,
        )  # fmt: skip

    @property
    def model_name(self) -> str:
        return self.config.served_model_name

    @property
    def kv_cache_tokens(self) -> int:
        """Tokens the whole KV pool holds (every sequence together, before prefix sharing)."""
        return self.block_manager.num_blocks * self.block_manager.block_size

    def num_free_blocks(self) -> int:
        return self.block_manager.num_free_blocks

    def stats(self) -> EngineStats:
        """The load now; safe to call from another thread (it reads lengths and counters only)."""
        blocks = self.block_manager.num_blocks
        return EngineStats(len(self.scheduler.running), len(self.scheduler.waiting),
                           1.0 - self.block_manager.num_free_blocks / blocks if blocks else 0.0,
                           self.scheduler.num_preemptions)  # fmt: skip

    def _processor(self):
        if self.processor is None and getattr(self.model_cls, "is_multimodal", False):
            from transformers import AutoProcessor

            self.processor = AutoProcessor.from_pretrained(self.config.model, local_files_only=True)
        return self.processor

    def normalize_prompt(self, prompt, mm_options=None) -> MultiModalPrompt:
        """Tokenize / run the processor (thread-safe: AsyncEngine calls it off the engine thread)."""
        return normalize_prompt(prompt, self.tokenizer, self.model_cls, self._processor(), mm_options,
                                self.max_prompt_chars, self.max_model_len)  # fmt: skip

    def encode_text(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of plain text, refused untokenized when it is too long to fit (thread-safe, as above)."""
        return encode_text(self.tokenizer, text, self.max_prompt_chars, self.max_model_len, add_special_tokens)

    def add_request(
        self, request_id: str, prompt, params: SamplingParams | None = None, mm_options=None, stream: bool = True
    ) -> None:
        """Validate and queue a request; raises InvalidRequestError / PromptTooLongError.

        `stream=False`: `step()` reports the request only once it is finished.
        """
        params = params or SamplingParams()
        if request_id in self.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        mm_prompt = self.normalize_prompt(prompt, mm_options)
        prompt_len = len(mm_prompt.token_ids)
        if params.max_tokens is None:
            if prompt_len >= self.max_model_len:
                raise PromptTooLongError(prompt_len, self.max_model_len)
            max_tokens = self.max_model_len - prompt_len
        else:
            max_tokens = params.max_tokens
            if prompt_len + max_tokens > self.max_model_len:
                raise PromptTooLongError(prompt_len, self.max_model_len, max_tokens)
        pool_tokens = self.block_manager.num_blocks * self.block_manager.block_size
        if math.ceil((prompt_len + max_tokens) / self.block_manager.block_size) > self.block_manager.num_blocks:
            raise InvalidRequestError(
                f"{prompt_len} prompt tokens + {max_tokens} max_tokens can never fit in the KV cache of "
                f"{pool_tokens} tokens; lower max_tokens, shorten the prompt or give the cache more memory"
            )
        vocab = self.vocab_size
        for name, ids in (("logit_bias", params.logit_bias), ("stop_token_ids", params.stop_token_ids)):
            if any(t >= vocab for t in ids):
                raise InvalidRequestError(f"{name} names token {max(ids)}; this model's token ids are 0..{vocab - 1}")
        bs = self.config.cache.block_size
        seqs = [Sequence(request_id, mm_prompt, params, bs, index=i, max_tokens=max_tokens) for i in range(params.n)]
        if params.structured_output is not None:
            if self.config.tensor_parallel_size > 1:  # the workers sample, but the grammars live here
                raise InvalidRequestError(
                    "structured output (response_format, a required or named tool_choice) is not available with "
                    "tensor parallelism yet; serve with --tensor-parallel-size 1 for it"
                )
            for seq in seqs:
                seq.grammar = self.grammars.matcher(params.structured_output)
        request = Request(request_id, mm_prompt, params, seqs, self.tokenizer, stream)
        self.requests[request_id] = request
        # n > 1: the other completions start once the first one's prompt is in the prefix cache
        first = 1 if self.config.cache.enable_prefix_caching else len(seqs)
        request.pending = seqs[first:]
        for seq in seqs[:first]:
            self.scheduler.add(seq)

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request and free its KV blocks now; returns its final output (finish_reason "abort")."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        for seq in request.seqs:
            if not seq.is_finished:
                seq.finish("abort")
            self.scheduler.finish(seq)
        for completion in request.completions:  # the text of every token collected so far, deferred or not
            try:
                completion.detokenize()
            except Exception:  # noqa: BLE001 - an abort always ends the request (the step may have failed here)
                logger.exception("detokenizing %s failed while aborting it; its text stops before that", request_id)
                completion.queued.clear()
        return request.output()

    def take_failures(self) -> list[RequestFailedError]:
        """The requests that failed on their own since the last call (each already aborted, its blocks free)."""
        failed, self._failed = self._failed, []
        return failed

    def _fail(self, request_id: str, cause: Exception) -> None:
        if request_id not in self.requests:
            return
        self.abort(request_id)
        self._failed.append(RequestFailedError(request_id, cause))

    def has_unfinished(self) -> bool:
        # A launched step whose requests all ended (aborted, stopped) needs no further call: its
        # tokens would be dropped, and its freed blocks are only reused by steps queued after it.
        return bool(self.requests)

    def step(self) -> list[RequestOutput]:
        """Advance one forward pass; return an output for every request that got new text or finished.

        Pipelined: the step launched by the previous call is collected (its tokens appended, the
        cheap stop checks run), the next step is scheduled and launched on the device, and while it
        computes, the collected tokens are detokenized (stop strings) and reported. So the outputs
        returned by a call are those of the step launched by the call before it.

        With async scheduling the next step is scheduled and launched *before* the previous one is
        collected: its decode rows read their input token from the device, so the GPU never waits
        for the host between steps. A row whose in-flight token turns out to end its sequence (EOS,
        a stop id or string) is computed for nothing and dropped when collected.
        """
        previous, self._inflight = self._inflight, None
        if previous is not None and not self.async_scheduling:
            self._collect(*previous)
            previous = None
        seqs = self.scheduler.schedule()
        if seqs:
            samplers = [s for s in seqs if s.samples_this_step]
            samplers, pending, previous = self._launch(seqs, samplers, previous)
            self._inflight = (samplers, pending)
            self.scheduler.update(seqs)
            for seq in samplers:
                seq.num_pending += 1
        if previous is not None:  # async scheduling: the step above was queued before this one's tokens arrived
            self._collect(*previous)
        return self._report()

    def _launch(self, seqs: list[Sequence], samplers: list[Sequence], previous):
        """Queue the step over `seqs`; returns the sequences it samples for, their pending tokens, and `previous`
        (None once collected here).

        A grammar row's mask needs its token still in flight (async scheduling): the forward pass is queued
        first and the sampling once `previous` is collected, so the device runs the forward pass meanwhile.
        A launch that raises is rerun in parts (isolation.py) so only the request that causes it fails.
        """
        defer = previous is not None and any(s.grammar is not None for s in samplers)
        try:
            if not defer:
                return samplers, self.runner.launch(seqs), previous
            unsampled = self.runner.launch(seqs, sample=False)
            self._collect(*previous)
            previous = None
            return samplers, self.runner.sample(unsampled), None
        except WorkerDiedError:  # the engine itself is gone: no request caused it, none can go on
            raise
        except Exception as e:  # noqa: BLE001 - pinned on the request(s) that cause it; the others go on
            if defer and previous is not None:  # the parts sample at once: their grammars need that token first
                self._collect(*previous)
                previous = None
            live = [s for s in seqs if not s.is_finished]  # collecting may have ended some, their blocks freed
            pending, failed = launch_isolated(self.runner, live, e)
            for request_id, cause in failed.items():
                self._fail(request_id, cause)
            return [s for s in samplers if not s.is_finished], pending, previous

    def _collect(self, samplers: list[Sequence], pending) -> None:
        try:
            result = pending.result()  # waits for that step's tokens
        except WorkerDiedError:  # the engine itself is gone: every request ends with it
            raise
        except Exception as e:  # noqa: BLE001 - the device failed this step: its requests fail, the others go on
            logger.exception("collecting a step failed; failing its %d sequences' requests", len(samplers))
            for seq in samplers:
                self._fail(seq.request_id, e)
            return
        eos = set(self.eos_token_ids)
        for seq, token_id, logprobs in zip(samplers, result.token_ids, result.logprobs, strict=True):
            request = self.requests.get(seq.request_id)
            if seq.is_finished or request is None:
                continue  # ended while its step ran (a stop string, an abort): the token is dropped
            seq.append_token(token_id, logprobs)
            if request.first_token_time is None:
                request.first_token_time = time.monotonic()
            try:
                request.completions[seq.index].append(token_id, eos, self.max_model_len)
                if seq.grammar is not None and not seq.is_finished:
                    self._advance_grammar(seq, token_id)
            except Exception as e:  # noqa: BLE001 - this request's own state: it fails alone
                self._fail(seq.request_id, e)
                continue
            if request.pending:  # the prompt's full blocks are cached now: the siblings reuse them
                for sibling in request.pending:
                    self.scheduler.add(sibling)
                request.pending = []
            if seq.is_finished:
                self.scheduler.finish(seq)
            self._touched[seq.request_id] = request

    @staticmethod
    def _advance_grammar(seq: Sequence, token_id: int) -> None:
        if not advance(seq.grammar, token_id):
            logger.error("request %s: token %d breaks its grammar (%s); ending it", seq.request_id, token_id,
                         seq.grammar.get_error())  # fmt: skip
            seq.finish("abort")
        elif seq.grammar.is_stopped():  # the text is complete: EOS is all the grammar would allow next
            seq.finish("stop")

    def _report(self) -> list[RequestOutput]:
        touched, self._touched = self._touched, {}
        outputs = []
        for request_id, request in touched.items():
            if self.requests.get(request_id) is not request:
                continue  # aborted meanwhile; abort() reported it
            try:
                for completion in request.completions:
                    if completion.detokenize():
                        self.scheduler.finish(completion.seq)
                finished = request.finished
                output = request.output(finished=finished) if finished or request.stream else None
            except Exception as e:  # noqa: BLE001 - this request's own text: it fails alone
                logger.exception("request %s failed while detokenizing", request_id)
                self._fail(request_id, e)
                continue
            if output is not None:
                outputs.append(output)
            if finished:
                del self.requests[request_id]
        return outputs

    def close(self) -> None:
        self.runner.close()
