"""The inference engine's public surface: `LLM` (offline batches), `AsyncEngine` (serving), `SamplingParams`."""

from llm.config import CacheConfig, EngineConfig, SchedulerConfig
from llm.engine.async_engine import AsyncEngine
from llm.llm import LLM
from llm.outputs import CompletionOutput, RequestOutput
from llm.sampling_params import SamplingParams

__all__ = [
    "LLM",
    "AsyncEngine",
    "SamplingParams",
    "EngineConfig",
    "CacheConfig",
    "SchedulerConfig",
    "RequestOutput",
    "CompletionOutput",
]
