"""`AsyncEngine`: the engine behind an asyncio server, streaming each request's outputs.

One background thread owns the `LLMEngine` and runs its step loop, so the event
loop never waits on a forward pass. Coroutines talk to that thread through a
command queue (add, abort), answered through asyncio futures; step outputs go to
one asyncio.Queue per request, a step's outputs in one `call_soon_threadsafe` per event loop; a reader that
fell behind gets the outputs that queued up merged into one (`merge_outputs`). Many concurrent
`generate` calls are batched by the engine's scheduler. Leaving the
`async for` early (client disconnect, cancellation) aborts the request, which
frees its KV blocks at the next step boundary.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable

from vlchat.llm.config import EngineConfig
from vlchat.llm.engine.engine import LLMEngine
from vlchat.llm.errors import InvalidRequestError, WorkerDiedError
from vlchat.llm.outputs import EngineStats, RequestOutput
from vlchat.llm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


def deliver(streams: dict, items) -> None:
    """Hand (request id, output or error) pairs to their streams (`streams`: request id -> (event loop, queue)):
    one wake-up of each event loop for all of a step's outputs. A wake-up per output costs the engine thread far
    more (benchmarks/host_outputs.py; docs/PERF.md#engine-and-host): every call_soon_threadsafe writes to the
    loop's self-pipe and contends for the GIL with the loop it wakes."""
    batches: dict[asyncio.AbstractEventLoop, list] = {}
    for request_id, item in items:
        entry = streams.get(request_id)
        if entry is not None:
            batches.setdefault(entry[0], []).append((entry[1], item))
    for loop, batch in batches.items():
        try:
            loop.call_soon_threadsafe(_put_all, batch)
        except RuntimeError:  # that loop is closed: nobody is left to read these streams
            logger.debug("dropped %d outputs for a closed event loop", len(batch))


def merge_outputs(earlier: RequestOutput, later: RequestOutput) -> RequestOutput:
    """`later` carrying the deltas of both: what a reader that fell behind gets instead of several outputs, so it
    sends one chunk, not one per step (the cumulative fields are the later output's already)."""
    before = {c.index: c for c in earlier.outputs}
    for c in later.outputs:
        if c.index in before:
            c.delta_text = before[c.index].delta_text + c.delta_text
            c.delta_token_ids = before[c.index].delta_token_ids + c.delta_token_ids
    return later


def _put_all(batch: list) -> None:
    for queue_, item in batch:
        queue_.put_nowait(item)


def _settle(fut: asyncio.Future, result, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


class AsyncEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._closed = False
        self._failed: WorkerDiedError | None = None  # the engine cannot step any more (a tensor-parallel worker died)
        self._thread = threading.Thread(target=self._loop, name="vlchat-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: EngineConfig) -> AsyncEngine:
        return cls(LLMEngine(config))

    @classmethod
    def from_options(cls, model: str, **options) -> AsyncEngine:
        return cls.from_config(EngineConfig.from_options(model, **options))

    # -- what the app reads -------------------------------------------------

    @property
    def model_name(self) -> str:
        return self.engine.model_name

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def kv_cache_tokens(self) -> int:
        return self.engine.kv_cache_tokens

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def config(self) -> EngineConfig:
        return self.engine.config

    def num_free_blocks(self) -> int:
        return self.engine.num_free_blocks()

    @property
    def errored(self) -> bool:
        """The engine has stopped for good (GET /health answers 503); every request fails with the reason."""
        return self._failed is not None

    def stats(self) -> EngineStats:
        return self.engine.stats()

    # -- requests -----------------------------------------------------------

    async def generate(
        self,
        request_id: str,
        prompt,
        params: SamplingParams | None = None,
        mm_options: dict | None = None,
        stream: bool = True,
    ) -> AsyncIterator[RequestOutput]:
        """Stream the outputs of one request; each carries the cumulative text and the new delta.

        `stream=False`: only the final output comes; the engine builds no output for it before, and without stop
        strings detokenizes its tokens every 32 steps instead of every step (llm/engine/request.Completion).
        """
        if self._failed is not None:
            raise self._failed
        if self._closed:
            raise RuntimeError("the engine is shut down")
        if request_id in self._streams:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        loop = asyncio.get_running_loop()
        outputs: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = (loop, outputs)
        finished = False
        try:
            # tokenizing and image preprocessing run in a worker thread, not on the engine thread
            mm_prompt = await loop.run_in_executor(None, self.engine.normalize_prompt, prompt, mm_options)
            if params is not None and params.structured_output is not None:  # compiled here, not on the engine thread
                await loop.run_in_executor(None, self.engine.grammars.grammar, params.structured_output)
            await self._call(self.engine.add_request, request_id, mm_prompt, params, None, stream)
            held = None  # an error that came right behind outputs merged into one
            while not finished:
                if held is not None:
                    out, held = held, None
                else:
                    out = await outputs.get()
                while not isinstance(out, BaseException) and not out.finished and not outputs.empty():
                    later = outputs.get_nowait()  # the reader fell behind the engine: catch up in one output
                    if isinstance(later, BaseException):
                        held = later
                        break
                    out = merge_outputs(out, later)
                if isinstance(out, BaseException):
                    finished = True
                    raise out
                finished = out.finished
                yield out
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                await asyncio.shield(self._call(self.engine.abort, request_id))

    async def tokenize(self, prompt, mm_options: dict | None = None, add_special_tokens: bool = True) -> list[int]:
        """The token ids `generate` would feed the model for `prompt` (chat template and processor applied);
        `add_special_tokens=False`: a text prompt without the tokenizer's BOS and the like. Text too long to fit the
        context is refused (TextTooLongError) before it is tokenized, as in `generate`."""
        loop = asyncio.get_running_loop()
        if isinstance(prompt, str):
            return await loop.run_in_executor(None, self.engine.encode_text, prompt, add_special_tokens)
        mm_prompt = await loop.run_in_executor(None, self.engine.normalize_prompt, prompt, mm_options)
        return list(mm_prompt.token_ids)

    async def abort(self, request_id: str) -> None:
        """Stop a request; its KV blocks are free when this returns. Unknown ids are ignored."""
        await self._call(self._abort, request_id)

    def shutdown(self) -> None:
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=30)
        self.engine.close()

    # -- the engine thread --------------------------------------------------

    def _call(self, fn: Callable, *args) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._commands.put((fn, args, loop, fut))
        self._wake.set()
        return fut

    def _run_commands(self) -> None:
        while True:
            try:
                fn, args, loop, fut = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                result, error = fn(*args), None
            except Exception as e:  # noqa: BLE001 - handed to the awaiting coroutine
                result, error = None, e
            loop.call_soon_threadsafe(_settle, fut, result, error)

    def _abort(self, request_id: str) -> None:
        out = self.engine.abort(request_id)
        if out is not None:
            self._deliver(request_id, out)  # the stream ends with finish_reason "abort"

    def _deliver(self, request_id: str, item) -> None:
        deliver(self._streams, [(request_id, item)])

    def _loop(self) -> None:
        while True:
            self._run_commands()
            if self._closed:
                return
            if not self.engine.has_unfinished():
                self._wake.wait()
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except Exception as e:  # noqa: BLE001 - not pinned on a request (the scheduler): fail all, serve new ones
                logger.exception("engine step failed; aborting the running requests")
                if isinstance(e, WorkerDiedError):  # no step can run any more: later requests fail at once
                    self._failed = e
                failure = e if self._failed is not None else RuntimeError(f"the engine failed while generating: {e}")
                for request_id in list(self.engine.requests):
                    self.engine.abort(request_id)
                    self._deliver(request_id, failure)
                continue
            items = [(out.request_id, out) for out in outputs]
            items += [(error.request_id, error) for error in self.engine.take_failures()]  # each failed alone
            deliver(self._streams, items)
