"""Loading a model from a local Hugging Face directory: config.json, then the weights.

Checkpoint formats: one or sharded safetensors (with `model.safetensors.index.json`)
and legacy `pytorch_model*.bin` (read with `torch.load(weights_only=True)`).

Name mapping is declarative. A model lists `WeightRule`s in `weight_mapping`;
every rule whose regex matches a checkpoint name rewrites it in turn, and may say
which piece (`shard`) of a fused parameter the tensor is, or give a `loader` for a
packed layout. The rewritten name is looked up as is, with a leading "model."
added, and with it removed, which covers the layouts transformers writes for a
`*ForCausalLM` and for its bare `*Model`. Every parameter piece must be filled
exactly from the checkpoint; anything missing, unexpected or misshapen raises a
`WeightMismatchError` naming the tensors.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from vlchat.llm.config import is_gguf_file
from vlchat.llm.errors import InvalidRequestError, ModelLoadError, WeightMismatchError
from vlchat.llm.layers.attention import Attention
from vlchat.llm.layers.linear import default_weight_loader
from vlchat.llm.parallel import tp_group

ALL_SHARDS = "*"

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class WeightRule:
    """Rewrite checkpoint names matching `pattern` (a regex, searched) with `replacement` (re.sub syntax).

    Args:
        replacement: None drops the tensor (e.g. rotary `inv_freq` buffers, a tied lm_head).
        shard: which piece of a fused parameter the tensor fills ("q", 0, ...; "*" = all of them).
        loader: `loader(param, tensor)` used instead of the parameter's own `weight_loader`.
    """

    pattern: str
    replacement: str | None
    shard: str | int | None = None
    loader: Callable[[nn.Parameter, torch.Tensor], None] | None = None


def map_name(name: str, rules: list[WeightRule]) -> tuple[str, object, Callable | None] | None:
    """Apply every matching rule in order; None when a rule drops the tensor."""
    shard, loader = None, None
    for rule in rules:
        if re.search(rule.pattern, name) is None:
            continue
        if rule.replacement is None:
            return None
        name = re.sub(rule.pattern, rule.replacement, name)
        shard = rule.shard if rule.shard is not None else shard
        loader = rule.loader or loader
    return name, shard, loader


# Scales of an FP8 KV cache (x ~= fp8(x / scale) * scale) as checkpoints store them: compressed-tensors
# `self_attn.k_scale`/`v_scale`, ModelOpt `self_attn.k_proj.k_scale`, AutoFP8 `self_attn.k_proj.output_scale`, older
# `self_attn.kv_scale` (both caches). `q_scale`/`prob_scale` quantize attention's own inputs, which stay 16-bit here.
_KV_SCALE = re.compile(r"^(?P<attn>.*\.self_attn)\.(?:(?P<proj>[kv])_proj\.)?(?P<kind>k|v|kv|q|prob|output)_scale$")


def kv_scale_name(name: str) -> tuple[str, str] | None:
    """(the attention module's checkpoint name, "k" | "v" | "kv" | "q" | "prob") of a tensor holding an attention
    scale; None for any other tensor."""
    m = _KV_SCALE.match(name)
    if m is None:
        return None
    proj, kind = m["proj"], m["kind"]
    if proj is not None:  # k_proj.k_scale / k_proj.output_scale
        return (m["attn"], proj) if kind in (proj, "output") else None
    return None if kind == "output" else (m["attn"], kind)


def _kv_scale_owners(model: nn.Module) -> dict[str, Attention]:
    """The decoder's attention layers by the name of the `self_attn` module holding them."""
    owners = {}
    for name, module in model.named_modules():
        head, sep, _ = name.rpartition(".self_attn.")
        if isinstance(module, Attention) and sep:
            owners.setdefault(head + ".self_attn", module)
    return owners


def _load_kv_scale(attn_name: str, kind: str, tensor: torch.Tensor, rules, owners: dict[str, Attention]) -> None:
    """Keep a checkpoint's KV scale on its layer, one per tensor (a per-head scale's largest: every head's values
    stay in range); KeyError for a layer the model does not have, ValueError for a value no cache can take."""
    mapped = map_name(attn_name + ".k_scale", rules)  # the model's rules rename the prefix
    owner = None if mapped is None else _resolve(mapped[0].removesuffix(".k_scale"), owners)
    if owner is None:
        raise KeyError(attn_name)
    value = float(tensor.float().max()) if tensor.numel() else float("nan")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"a KV cache scale must be finite and > 0, got {value}")
    for i, which in enumerate("kv"):
        if which in kind:
            owners[owner].checkpoint_fp8_scales[i] = value


def _resolve(target: str, params: dict[str, nn.Parameter]) -> str | None:
    stripped = target[len("model.") :] if target.startswith("model.") else None
    for candidate in (target, "model." + target, stripped):
        if candidate is not None and candidate in params:
            return candidate
    return None


def checkpoint_files(model_dir: str | Path) -> list[Path]:
    """The weight files of a model directory, safetensors preferred over .bin."""
    model_dir = Path(model_dir)
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = model_dir / index_name
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            files = [model_dir / f for f in sorted(set(weight_map.values()))]
            absent = [f.name for f in files if not f.is_file()]
            if absent:
                raise ModelLoadError(f"{index} lists shards that are not in {model_dir}: {', '.join(absent)}")
            return files
    for pattern in ("model*.safetensors", "*.safetensors", "pytorch_model*.bin"):
        files = sorted(model_dir.glob(pattern))
        if files:
            return files
    raise ModelLoadError(
        f"no weights in {model_dir}: expected model.safetensors, sharded model-*.safetensors with "
        "model.safetensors.index.json, or pytorch_model*.bin"
    )


def iter_checkpoint(files: list[Path], progress: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, cpu tensor) pairs of every tensor in the files, with a progress bar over the files."""
    from safetensors import safe_open
    from tqdm.auto import tqdm

    for path in tqdm(files, desc="Loading weights", unit="file", disable=not progress):
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt", device="cpu") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
        else:
            try:
                state = torch.load(path, map_location="cpu", weights_only=True)
            except Exception as e:  # a pickle with code, or a truncated file
                lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
                reason = next((line for line in lines if "Unsupported global" in line), lines[0])  # one line
                message = f"cannot read {path} as plain tensors ({reason}); convert it to safetensors"
                raise ModelLoadError(message) from e
            yield from state.items()


def _checkpoint_tensors(model_dir: str | Path, progress: bool, gguf_blocks: bool) -> Iterator[tuple[str, torch.Tensor]]:
    if is_gguf_file(model_dir):  # dequantized to fp32 under HF names (the parameters' loaders cast), or blocks
        from vlchat.llm.gguf import load_gguf
        from vlchat.llm.gguf_layers import keeps_blocks

        return load_gguf(model_dir).weights(torch.float32, keep=keeps_blocks if gguf_blocks else None)
    return iter_checkpoint(checkpoint_files(model_dir), progress)


def load_weights(model: nn.Module, model_dir: str | Path, rules: list[WeightRule] | None = None, progress=True):
    """Fill every parameter of `model` from the checkpoint in `model_dir` (see the module docstring)."""
    rules = list(getattr(model, "weight_mapping", [])) if rules is None else rules
    gguf_blocks = getattr(model, "gguf_blocks", False)
    load_tensors(model, _checkpoint_tensors(model_dir, progress, gguf_blocks), rules, where=str(model_dir))
    with torch.no_grad():
        for module in model.modules():  # layers that re-lay their tensors once all are in (quantized ones)
            finish = getattr(module, "finish_loading", None)
            if finish is not None:
                finish()


def load_tensors(model: nn.Module, tensors: Iterable[tuple[str, torch.Tensor]], rules: list[WeightRule], where: str):
    """Fill every parameter of `model` from `(name, tensor)` pairs mapped through `rules`, or raise
    WeightMismatchError naming the missing, unexpected and wrong-shape tensors."""
    params = dict(model.named_parameters())
    expected = {(n, s) for n, p in params.items() for s in getattr(p, "shards", (None,))}
    kv_owners = _kv_scale_owners(model)
    loaded: set[tuple[str, object]] = set()
    unexpected, mismatched = [], []
    with torch.no_grad():
        for name, tensor in tensors:
            scale = kv_scale_name(name)
            if scale is not None:
                try:
                    if scale[1] not in ("q", "prob"):  # attention's own inputs stay 16-bit: their scales are unused
                        _load_kv_scale(*scale, tensor, rules, kv_owners)
                except KeyError:
                    unexpected.append(name)
                except ValueError as e:
                    mismatched.append(f"{name}: {e}")
                continue
            mapped = map_name(name, rules)
            if mapped is None:
                continue
            target, shard, loader = mapped
            pname = _resolve(target, params)
            if pname is None:
                unexpected.append(name)
                continue
            param = params[pname]
            try:
                if loader is not None:
                    loader(param, tensor)
                else:
                    getattr(param, "weight_loader", default_weight_loader)(param, tensor, shard)
            except ValueError as e:
                mismatched.append(f"{name} -> {pname}: {e}")
                continue
            pieces = getattr(param, "shards", (None,)) if shard in (None, ALL_SHARDS) else (shard,)
            loaded.update((pname, s) for s in pieces)
    missing = [n if s is None else f"{n} (piece {s!r})" for n, s in sorted(expected - loaded, key=str)]
    if missing or unexpected or mismatched:
        raise WeightMismatchError(missing, unexpected, mismatched, where=where)


def vocab_size(hf_config) -> int:
    """The size of the model's token vocabulary (the rows of its LM head)."""
    return getattr(hf_config, "vocab_size", None) or hf_config.get_text_config().vocab_size


def load_hf_config(model_dir: str | Path):
    """The transformers config of a local model directory (a plain `PretrainedConfig` for unknown model types)."""
    from transformers import AutoConfig, PretrainedConfig

    if is_gguf_file(model_dir):
        from vlchat.llm.gguf import load_gguf

        return load_gguf(model_dir).config
    model_dir = Path(model_dir)
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"{model_dir} has no config.json; point --model at a Hugging Face model directory")
    try:
        return AutoConfig.from_pretrained(model_dir, local_files_only=True)
    except (ValueError, KeyError):
        # a model type transformers does not know (e.g. internlm2, which ships remote code): read it as plain fields
        try:
            return PretrainedConfig.from_dict(json.loads(config_path.read_text()))
        except (ValueError, TypeError) as e:
            raise ModelLoadError(f"cannot read {config_path}: {e}") from e


def resolve_dtype(hf_config, dtype: str | torch.dtype | None = None) -> torch.dtype:
    """The explicit `dtype` unless None/"auto", else the config's `dtype` (`torch_dtype`), else float32."""
    if dtype is None or dtype == "auto":
        dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None) or torch.float32
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise InvalidRequestError(f"dtype {dtype} is not supported; use float32, float16 or bfloat16")
        return dtype
    key = str(dtype).removeprefix("torch.")
    if key not in _DTYPES:
        raise InvalidRequestError(f"unknown dtype {dtype!r}; use auto, float32, float16 or bfloat16")
    return _DTYPES[key]


def fill_random(model: nn.Module, seed: int | None = 0) -> None:
    """Random weights in place of a checkpoint, of each parameter's kind: matrices ~ N(0, 0.02) (as FP8 codes
    with their row scales, or random 4-bit codes, scales and zeros in the W4A16 layout), norms and biases 1,
    act-order groups in order. `seed` None draws from the current generator."""
    if seed is not None:
        torch.manual_seed(seed)  # drawn where the parameters are: a 70B shard fills in seconds on its GPU
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rpartition(".")[2]
            if p.dtype == torch.float8_e4m3fn:
                p.copy_((torch.randn(p.shape, device=p.device) * 100).clamp(-448, 448).to(p.dtype))
            elif leaf == "g_idx":
                groups = model.get_submodule(name.rpartition(".")[0]).scales.shape[0]
                p.copy_(torch.arange(p.numel(), device=p.device) // (p.numel() // groups))
            elif p.dtype == torch.int32:
                p.random_(-(2**31), 2**31 - 1)
            elif p.dtype == torch.uint8:
                p.random_(0, 16)
            elif leaf == "weight_scale":
                p.fill_(0.02 * 4 / 448)
            elif leaf == "scales":
                p.fill_(0.02 / 4)
            else:
                p.normal_(0.0, 0.02) if p.dim() >= 2 else p.fill_(1.0)
        for name, b in model.named_buffers():
            if name.endswith(".weight_scale"):  # FP8 quantized at load: the scales are buffers
                b.fill_(0.02 * 4 / 448)


def load_model(
    model_dir: str | Path, dtype: str | torch.dtype | None = None, device="cpu", progress=True, hf_config=None,
    random_weights: bool = False, quantization: str | None = None,
):  # fmt: skip
    """Build the model class registered for the directory's architecture and load its weights.

    Args:
        model_dir: a local Hugging Face model directory.
        dtype: None/"auto" takes the config's dtype; else float32, float16 or bfloat16.
        device: where the parameters are allocated.
        hf_config: the directory's config when the caller has read it already.
        random_weights: fill the parameters with `fill_random` instead of reading the checkpoint.
        quantization: "fp8" quantizes a 16-bit checkpoint's decoder projections to FP8 at load (llm/quant_fp8.py).

    Returns:
        The model in eval mode; its `hf_config` and `dtype` attributes say what it was built from.
    """
    from vlchat.llm.models.registry import get_model_class

    hf_config = hf_config if hf_config is not None else load_hf_config(model_dir)
    build_config = hf_config
    if quantization is not None:
        from vlchat.llm.quant_fp8 import QUANTIZE_AT_LOAD, with_fp8_at_load

        if quantization != QUANTIZE_AT_LOAD:
            raise InvalidRequestError(f"unknown quantization {quantization!r}; use {QUANTIZE_AT_LOAD!r} or none")
        from vlchat.llm.quantization import quant_config_from_hf

        if quant_config_from_hf(hf_config) is not None or is_gguf_file(model_dir):  # a KV-only scheme may stay
            raise InvalidRequestError(
                f"{model_dir} is quantized already; serve it without --quantization, or pass a 16-bit checkpoint"
            )
        build_config = with_fp8_at_load(hf_config)
    gguf_blocks = is_gguf_file(model_dir) and not random_weights and quantization is None and tp_group().size == 1
    if gguf_blocks:  # served from the file's blocks (llm/gguf_layers.py); dequantized at load when sharded
        from vlchat.llm.gguf_layers import with_gguf_blocks

        build_config = with_gguf_blocks(hf_config)
    model_cls = get_model_class(build_config)
    torch_dtype = resolve_dtype(hf_config, dtype)
    previous = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch_dtype)
        with torch.device(device):
            model = model_cls(build_config, torch_dtype)
    finally:
        torch.set_default_dtype(previous)
    model.gguf_blocks = gguf_blocks
    if random_weights:
        fill_random(model)
    else:
        load_weights(model, model_dir, progress=progress)
    model.hf_config = hf_config
    model.dtype = torch_dtype
    return model.eval()
