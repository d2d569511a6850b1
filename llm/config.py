"""Engine configuration: built once at the edge (CLI, app, `LLM(...)`) and passed down.

Each component copies the fields it uses. `EngineConfig.from_options(model, **options)`
routes flat keyword options (`LLM(model, max_num_seqs=8, num_blocks=64)`) to the
sub-config that owns them. No component reads environment variables.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from vlchat.llm.errors import InvalidRequestError

DTYPES = ("auto", "float32", "float16", "bfloat16")
DEVICES = ("auto", "cuda", "cpu")
KERNEL_BACKENDS = ("auto", "triton", "torch")
LOAD_FORMATS = ("auto", "dummy")
KV_CACHE_DTYPES = ("auto", "fp8", "int8", "int4")  # kernels/attention/kv_quant.py's (a test keeps the two equal)
QUANTIZATIONS = ("fp8",)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidRequestError(message)


@dataclass(slots=True)
class CacheConfig:
    """Paged KV cache.

    Args:
        block_size: tokens per KV block.
        cache_fraction: on CUDA, the fraction of the free GPU memory (measured after the
            weights are loaded and a warm-up forward ran) given to the KV cache.
        num_blocks: an explicit number of KV blocks; overrides `cache_fraction`/`cpu_cache_gb`.
        cpu_cache_gb: on CPU, the KV cache size in GB.
        enable_prefix_caching: share full blocks across requests by content hash.
        kv_cache_dtype: "auto" stores K/V in the model's dtype; "fp8" as FP8 e4m3 with a per-tensor scale
            (1.0), half the bytes; "int8" as 8-bit codes with a float32 scale and zero point per token and
            KV head; "int4" the same with 4-bit codes, a quarter of fp16's bytes plus the scales
            (docs/KV_CACHE.md says what each costs in accuracy). The pool is sized by the chosen format's
            bytes per token.
    """

    block_size: int = 16
    cache_fraction: float = 0.9
    num_blocks: int | None = None
    cpu_cache_gb: float = 0.25
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        _check(self.block_size >= 1 and self.block_size & (self.block_size - 1) == 0,
               f"block_size must be a power of two, got {self.block_size}")  # fmt: skip
        _check(0.0 < self.cache_fraction <= 1.0, f"cache_fraction must be in (0, 1], got {self.cache_fraction}")
        _check(self.num_blocks is None or self.num_blocks >= 1, f"num_blocks must be >= 1, got {self.num_blocks}")
        _check(self.cpu_cache_gb > 0, f"cpu_cache_gb must be > 0, got {self.cpu_cache_gb}")
        _check(self.kv_cache_dtype in KV_CACHE_DTYPES,
               f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")  # fmt: skip


# the prefill hold with CUDA graphs; chosen by benchmarks/serving.py, see docs/PERF.md#engine-and-host
GRAPH_PREFILL_DELAY_STEPS = 16


@dataclass(slots=True)
class SchedulerConfig:
    """Continuous batching.

    Args:
        max_num_seqs: sequences running at once (also the largest CUDA-graph decode batch).
        max_num_batched_tokens: token budget of one step; prompts longer than what is left
            of it are prefilled in chunks, mixed with the decodes of running sequences.
        enable_chunked_prefill: split long prompts over several steps; when off, a prompt
            must fit the budget whole (the budget is then raised to max_model_len).
        prefill_delay_steps: while sequences are decoding, newly arrived prompts may wait up to
            this many steps so that several are prefilled in one step. A step that prefills runs
            eagerly while a decode-only step replays a CUDA graph, so under a steady stream of
            arrivals admitting each prompt at once turns almost every step into a slow mixed one;
            holding them a few steps trades a little time to first token for throughput. None: the
            engine picks GRAPH_PREFILL_DELAY_STEPS when decode steps replay CUDA graphs, else 0
            (admit at once).
        prefill_batch_tokens: held prompts are admitted as soon as they bring this many prompt
            tokens together (None: a quarter of max_num_batched_tokens).
    """

    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    prefill_delay_steps: int | None = None
    prefill_batch_tokens: int | None = None

    def __post_init__(self) -> None:
        _check(self.max_num_seqs >= 1, f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        _check(self.max_num_batched_tokens >= 1,
               f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")  # fmt: skip
        _check(self.prefill_delay_steps is None or self.prefill_delay_steps >= 0,
               f"prefill_delay_steps must be None or >= 0, got {self.prefill_delay_steps}")  # fmt: skip
        _check(self.prefill_batch_tokens is None or self.prefill_batch_tokens >= 1,
               f"prefill_batch_tokens must be None or >= 1, got {self.prefill_batch_tokens}")  # fmt: skip


@dataclass(slots=True)
class EngineConfig:
    """Everything the engine needs to start.

    Args:
        model: a local Hugging Face model directory, or a GGUF file (llm/gguf.py).
        tokenizer: tokenizer directory (default: the model directory).
        dtype: "auto" takes the config's dtype on CUDA (bf16 falls back to fp16 where the
            GPU lacks bf16) and float32 on CPU.
        device: "auto" picks CUDA when present.
        max_model_len: context limit; default from the config and its RoPE scaling.
        enforce_eager: never capture CUDA graphs.
        piecewise_graph_tokens: prefill and mixed steps of up to this many tokens (without image rows) replay
            CUDA graphs in pieces between the attention calls (llm/engine/piecewise.py); 0 (the default): they run
            eagerly. Off by default: with async scheduling the eager launches already overlap the step in flight,
            so pieces shorten a mixed step without raising serving throughput (docs/PERF.md#engine-and-host).
        async_scheduling: schedule and launch step N+1 before step N's tokens reach the host
            (decode rows take their input token from the device), so the GPU does not wait for
            the host between steps. A sequence whose in-flight token may end it costs one wasted
            row; one that needs its output history to sample (penalties, min_tokens) waits a
            step. None: on for CUDA, off on the CPU (where the forward pass is synchronous).
        kernel_backend: "auto" | "triton" | "torch", passed to kernels.settings.set_backend;
            None keeps the process's setting (VLCHAT_KERNEL_BACKEND, default auto).
        quantization: "fp8" quantizes a 16-bit checkpoint's decoder projections to FP8 (W8A8) at load;
            None serves the checkpoint as stored (quantized checkpoints say so in their config).
        seed: seeds the engine's generator used by unseeded sampling requests.
        served_model_name: the name the API reports (default: the directory name).
        tensor_parallel_size: shard the decoder over this many worker processes, one per GPU
            (llm/engine/workers.py, docs/TENSOR_PARALLEL.md); 1 runs the model in this process.
        tp_listen: "HOST:PORT" where the engine waits for workers started elsewhere (torchrun over
            several machines) instead of starting them here; needs tp_authkey.
        tp_authkey: hex key the workers prove they hold (the variable VLCHAT_TP_AUTHKEY of workers
            started elsewhere); a random one for workers started here.
        load_format: "auto" reads the checkpoint; "dummy" fills the weights randomly without reading
            any (benchmarks at real shapes from a directory holding only config.json and a tokenizer).
    """

    model: str
    tokenizer: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    max_model_len: int | None = None
    enforce_eager: bool = False
    piecewise_graph_tokens: int = 0
    async_scheduling: bool | None = None
    kernel_backend: str | None = None
    quantization: str | None = None
    seed: int = 0
    served_model_name: str | None = None
    tensor_parallel_size: int = 1
    tp_listen: str | None = None
    tp_authkey: str | None = None
    load_format: str = "auto"
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)

    def __post_init__(self) -> None:
        self.model = os.fspath(self.model)
        _check(os.path.isdir(self.model) or is_gguf_file(self.model),
               f"model directory {self.model!r} does not exist; pass a local HF model dir or a .gguf file")  # fmt: skip
        _check(self.dtype in DTYPES, f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        _check(self.device in DEVICES, f"device must be one of {DEVICES}, got {self.device!r}")
        _check(self.kernel_backend is None or self.kernel_backend in KERNEL_BACKENDS,
               f"kernel_backend must be one of {KERNEL_BACKENDS}, got {self.kernel_backend!r}")  # fmt: skip
        _check(self.quantization is None or self.quantization in QUANTIZATIONS,
               f"quantization must be one of {QUANTIZATIONS}, got {self.quantization!r}")  # fmt: skip
        _check(self.max_model_len is None or self.max_model_len >= 1,
               f"max_model_len must be >= 1, got {self.max_model_len}")  # fmt: skip
        _check(self.load_format in LOAD_FORMATS, f"load_format must be one of {LOAD_FORMATS}, got {self.load_format!r}")
        _check(self.tensor_parallel_size >= 1, f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        _check(self.piecewise_graph_tokens >= 0,
               f"piecewise_graph_tokens must be >= 0, got {self.piecewise_graph_tokens}")  # fmt: skip
        if self.tp_listen is not None:
            host, sep, port = self.tp_listen.rpartition(":")
            _check(bool(sep and host and port.isdigit()), f"tp_listen must be HOST:PORT, got {self.tp_listen!r}")
            _check(self.tensor_parallel_size > 1, "tp_listen needs tensor_parallel_size > 1")
            _check(self.tp_authkey is not None, "tp_listen needs tp_authkey (VLCHAT_TP_AUTHKEY), the workers' key")
        if self.tp_authkey is not None:
            try:
                bytes.fromhex(self.tp_authkey)
            except ValueError:
                raise InvalidRequestError("tp_authkey must be hex digits (e.g. from `openssl rand -hex 16`)") from None
        self.tokenizer = os.fspath(self.tokenizer) if self.tokenizer else self.model
        if self.served_model_name is None:
            self.served_model_name = os.path.basename(os.path.normpath(self.model))

    @classmethod
    def from_options(cls, model: str, **options) -> EngineConfig:
        """Build from flat keyword options; each goes to the (sub-)config that has a field of that name."""
        sub = {"cache": CacheConfig, "scheduler": SchedulerConfig}
        own = {f.name for f in dataclasses.fields(cls)} - set(sub)
        parts: dict[str, dict] = {name: {} for name in sub}
        top: dict = {}
        for key, value in options.items():
            if key in own:
                top[key] = value
                continue
            owner = next((n for n, klass in sub.items() if key in {f.name for f in dataclasses.fields(klass)}), None)
            if owner is None:
                raise InvalidRequestError(f"unknown engine option {key!r}; see llm/config.py for the options")
            parts[owner][key] = value
        return cls(model=model, **top, **{name: sub[name](**kw) for name, kw in parts.items()})


def is_gguf_file(path: str | os.PathLike) -> bool:
    """A GGUF checkpoint (checked by name, so the gguf package is imported only for such files)."""
    return os.fspath(path).lower().endswith(".gguf") and os.path.isfile(path)
