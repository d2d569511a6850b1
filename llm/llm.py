"""`LLM`: offline batch generation on top of the engine's step loop."""

from __future__ import annotations

from collections.abc import Sequence as Seq

from vlchat.llm.config import EngineConfig
from vlchat.llm.engine.engine import LLMEngine
from vlchat.llm.errors import InvalidRequestError
from vlchat.llm.outputs import RequestOutput
from vlchat.llm.sampling_params import SamplingParams


class LLM:
    """Generate for a list of prompts at once.

    Args:
        model: a local Hugging Face model directory.
        dtype: "auto" | "float32" | "float16" | "bfloat16".
        device: "auto" | "cuda" | "cpu".
        **engine_options: any field of EngineConfig, CacheConfig or SchedulerConfig
            (e.g. max_num_seqs=8, num_blocks=64, enforce_eager=True, max_model_len=4096).

    Example:
        >>> llm = LLM("path/to/model")
        >>> out = llm.generate(["Hello"], SamplingParams(max_tokens=8))[0]
        >>> out.text, out.token_ids, out.finish_reason
    """

    def __init__(self, model: str, dtype: str = "auto", device: str = "auto", **engine_options) -> None:
        self.config = EngineConfig.from_options(model, dtype=dtype, device=device, **engine_options)
        self.engine = LLMEngine(self.config)
        self._counter = 0

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts,
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        mm_options: dict | None = None,
    ) -> list[RequestOutput]:
        """Generate for each prompt; returns one finished RequestOutput per prompt, in order.

        Args:
            prompts: a string, a list of strings, a list of token-id lists, or a list of chat
                conversations (each an OpenAI-style list of message dicts).
            sampling_params: one for all prompts, or one per prompt (default: SamplingParams()).
            mm_options: for vision models, per-request image options: `max_images`, and for
                Qwen2-VL/2.5-VL `min_pixels`/`max_pixels`.
        """
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], (int, dict))):
            prompts = [prompts]
        params = sampling_params if sampling_params is not None else SamplingParams()
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise InvalidRequestError(f"got {len(params)} sampling params for {len(prompts)} prompts; pass 1 or 1 each")
        ids = []
        try:
            for prompt, p in zip(prompts, params, strict=True):
                request_id = f"llm-{self._counter}"
                self._counter += 1
                self.engine.add_request(request_id, prompt, p, mm_options=mm_options, stream=False)
                ids.append(request_id)
            final: dict[str, RequestOutput] = {}
            while self.engine.has_unfinished():
                for out in self.engine.step():
                    if out.finished:
                        final[out.request_id] = out
                failures = self.engine.take_failures()
                if failures:
                    raise failures[0]
        except BaseException:
            for request_id in ids:
                self.engine.abort(request_id)
            raise
        return [final[i] for i in ids]

    def close(self) -> None:
        """Free the KV cache and CUDA graphs now (the engine cannot generate afterwards)."""
        self.engine.close()
