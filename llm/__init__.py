"""The inference engine's public surface: `LLM` (offline batches), `AsyncEngine` (serving), `SamplingParams`."""

from vlchat.llm.config import CacheConfig, EngineConfig, SchedulerConfig
from vlchat.llm.engine.async_engine import AsyncEngine
from vlchat.llm.llm import LLM
from vlchat.llm.outputs import CompletionOutput, RequestOutput
from vlchat.llm.sampling_params import SamplingParams, StructuredOutputParams

__all__ = [
    "LLM",
    "AsyncEngine",
    "SamplingParams",
    "StructuredOutputParams",
    "EngineConfig",
    "CacheConfig",
    "SchedulerConfig",
    "RequestOutput",
    "CompletionOutput",
]
