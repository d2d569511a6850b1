"""Rotary position embeddings: every RoPE variant of Hugging Face configs, matching transformers numerically.

Types: default, linear, dynamic (NTK), yarn, llama3, longrope, proportional.
`inv_freq` and the attention scaling are computed exactly as transformers'
`ROPE_INIT_FUNCTIONS` do (same fp32 ops on the CPU); the cos/sin cache is
`positions * inv_freq` -> (cos, sin) * attention_scaling, fp32, [max_position, rotary_dim].

Length-dependent types follow transformers' `dynamic_rope_update`, driven by
the model runner calling `update_rope_for_length(model, seq_len)` before each
forward, where seq_len = max over the batch of (position of its last token + 1),
transformers' `max(position_ids) + 1`:

- dynamic: with M = max_position_embeddings, the table starts at the unscaled
  base. A forward with seq_len above the longest length seen so far (starting
  at M) recomputes inv_freq with base' = base * (factor * L / M - (factor - 1))
  ** (d / (d - 2)) for L = seq_len (in fp32 tensor arithmetic, as transformers
  does) and remembers L. A forward with seq_len < M after growth resets to the
  unscaled base. Otherwise the table is left as is. Keys already in the KV cache
  keep the rotation they were written with, as in transformers' cache; so
  results depend on history: batch-1 unchunked generation matches transformers
  token for token, chunked prefill and prefix-cache hits may differ from it.
- longrope: every forward uses the long factors when seq_len > the original
  length, the short factors otherwise (for all positions of that forward).

Other types are static, and `get_rope` shares one module per distinct argument
set across the process (dynamic modules are never shared: they carry history).
"""

from __future__ import annotations

import functools
import json
import math

import torch
from torch import nn

from vlchat.kernels.ops import apply_rotary

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope", "proportional")
_ALIASES = {"su": "longrope", "mrope": "default"}
_ORIGINAL_LEN_TYPES = ("llama3", "yarn", "longrope")
_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length")


def _get(cfg, key, default=None):
    if isinstance(cfg, dict):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


def _text_config(hf_config):
    if not isinstance(hf_config, dict) and hasattr(hf_config, "get_text_config"):
        return hf_config.get_text_config()
    return hf_config


def _normalize(params: dict, cfg, override_original: bool) -> dict:
    p = dict(params)
    rope_type = p.get("rope_type", p.get("type", "default"))
    p["rope_type"] = _ALIASES.get(rope_type, rope_type)
    p.pop("type", None)
    if p["rope_type"] not in ROPE_TYPES:
        raise ValueError(f"unsupported RoPE type {rope_type!r}; supported: {', '.join(ROPE_TYPES)}")
    if p.get("rope_theta") is None:
        p["rope_theta"] = _get(cfg, "rope_theta") or 10000.0
    if "partial_rotary_factor" not in p and _get(cfg, "partial_rotary_factor") is not None:
        p["partial_rotary_factor"] = _get(cfg, "partial_rotary_factor")
    p.setdefault("max_position_embeddings", _get(cfg, "max_position_embeddings"))
    if p["rope_type"] in _ORIGINAL_LEN_TYPES:
        # Like transformers: a top-level `original_max_position_embeddings` (Phi-3) wins for flat configs.
        top = _get(cfg, "original_max_position_embeddings")
        if override_original and top is not None:
            p["original_max_position_embeddings"] = top
        p.setdefault("original_max_position_embeddings", p["max_position_embeddings"])
    return p


def _nested_keys(params: dict, cfg) -> list[str]:
    labels = _get(cfg, "layer_types") or ()
    labels = set(labels) | {"full_attention", "sliding_attention"}
    return [key for key, value in params.items() if key in labels and isinstance(value, dict)]


def rope_parameters_from_config(hf_config, layer_type: str | None = None) -> dict:
    """Normalised RoPE parameters from a config (object or config.json dict).

    Reads transformers-5 `rope_parameters`, else the legacy `rope_scaling` + `rope_theta`.
    Per-layer-type parameters (Gemma 3: {"full_attention": {...}, "sliding_attention": {...}})
    come back as such a dict of normalised dicts, or the one for `layer_type` when given.
    Each flat dict has rope_type, rope_theta, max_position_embeddings and the type's own keys.
    """
    cfg = _text_config(hf_config)
    params = _get(cfg, "rope_parameters") or _get(cfg, "rope_scaling") or {}
    nested = _nested_keys(params, cfg)
    if not nested:
        return _normalize(params, cfg, override_original=True)
    out = {key: _normalize(params[key], cfg, override_original=False) for key in nested}
    if layer_type is None:
        return out
    if layer_type not in out:
        raise ValueError(f"no RoPE parameters for layer type {layer_type!r}; the config has {sorted(out)}")
    return out[layer_type]


def max_model_len_from_config(hf_config) -> int:
    """The longest sequence (prompt + output) the config supports, scaling included.

    The smallest length key present (max_position_embeddings, n_positions, ...), times `factor`
    for linear and dynamic scaling; for yarn original_max_position_embeddings * factor. llama3,
    longrope and per-layer-type configs (Gemma 3) already state the extended length.
    """
    cfg = _text_config(hf_config)
    lengths = [int(_get(cfg, key)) for key in _LENGTH_KEYS if isinstance(_get(cfg, key), int | float)]
    if not lengths:
        raise ValueError(f"the config names no maximum length (none of {', '.join(_LENGTH_KEYS)})")
    length = min(lengths)
    params = rope_parameters_from_config(cfg)
    if "rope_type" not in params:  # per layer type: max_position_embeddings is already the extended length
        return length
    factor = params.get("factor") or 1.0
    if params["rope_type"] in ("linear", "dynamic"):
        return int(length * factor)
    if params["rope_type"] == "yarn":
        return int(params["original_max_position_embeddings"] * factor)
    return length


def _exponents(dim: int) -> torch.Tensor:
    return torch.arange(0, dim, 2, dtype=torch.int64).float() / dim


def compute_inv_freq(params: dict, head_dim: int, rotary_dim: int, seq_len=None) -> tuple[torch.Tensor, float]:
    """(inv_freq [rotary_dim / 2] fp32 on the CPU, attention_scaling) for one RoPE type, as transformers computes.

    Always on the CPU in fp32, whatever device context or default dtype the caller
    (e.g. a model built under `torch.device("cuda")`) has set.
    """
    with torch.device("cpu"):
        inv_freq, scaling = _compute_inv_freq(params, head_dim, rotary_dim, seq_len)
    return inv_freq.float(), scaling


def _compute_inv_freq(params: dict, head_dim: int, rotary_dim: int, seq_len) -> tuple[torch.Tensor, float]:
    kind, base, dim = params["rope_type"], params["rope_theta"], rotary_dim
    if kind in ("default", "linear"):
        inv_freq = 1.0 / (base ** _exponents(dim))
        return (inv_freq / params["factor"] if kind == "linear" else inv_freq), 1.0
    if kind == "proportional":
        angles = int(params.get("partial_rotary_factor", 1.0) * head_dim // 2)
        inv_freq = 1.0 / (base ** (torch.arange(0, 2 * angles, 2, dtype=torch.int64).float() / head_dim))
        inv_freq = torch.cat((inv_freq, torch.zeros(head_dim // 2 - angles, dtype=torch.float32)))
        return inv_freq / params.get("factor", 1.0), 1.0
    if kind == "dynamic":
        factor, m = params["factor"], params["max_position_embeddings"]
        if seq_len is None:  # python floats, as at transformers' init
            base = base * ((factor * m / m) - (factor - 1)) ** (dim / (dim - 2))
        else:  # fp32 tensor arithmetic, as in transformers' dynamic update
            length = torch.maximum(torch.tensor(seq_len), torch.tensor(m)).float()
            base = base * ((factor * length / m) - (factor - 1)) ** (dim / (dim - 2))
        return 1.0 / (base ** _exponents(dim)), 1.0
    if kind == "llama3":
        return _llama3_inv_freq(params, dim), 1.0
    if kind == "yarn":
        return _yarn_inv_freq(params, dim)
    return _longrope_inv_freq(params, dim, seq_len)


def _llama3_inv_freq(p: dict, dim: int) -> torch.Tensor:
    inv_freq = 1.0 / (p["rope_theta"] ** _exponents(dim))
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old_len = p["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_mscale(scale, mscale=1):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(p: dict, dim: int) -> tuple[torch.Tensor, float]:
    base, original = p["rope_theta"], p["original_max_position_embeddings"]
    factor = p.get("factor") or p["max_position_embeddings"] / original
    attention = p.get("attention_factor")
    if attention is None:
        mscale, mscale_all_dim = p.get("mscale"), p.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention = float(_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim))
        else:
            attention = _yarn_mscale(factor)
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

    def correction_dim(rotations):
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp  # 1: extrapolate (high frequencies), 0: interpolate (low frequencies)
    return interpolation * (1 - keep) + extrapolation * keep, attention


def _longrope_inv_freq(p: dict, dim: int, seq_len) -> tuple[torch.Tensor, float]:
    original = p["original_max_position_embeddings"]
    factor = p.get("factor") or p["max_position_embeddings"] / original
    attention = p.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    ext = p["long_factor"] if seq_len and seq_len > original else p["short_factor"]
    return 1.0 / (torch.tensor(ext, dtype=torch.float32) * p["rope_theta"] ** _exponents(dim)), attention


def _cos_sin(inv_freq: torch.Tensor, rows: int, scaling: float, device) -> torch.Tensor:
    # -> [rows, rotary_dim] fp32: cos half then sin half, attention scaling folded in
    inv_freq = inv_freq.to(device)
    freqs = torch.arange(rows, dtype=torch.int64, device=device).float()[:, None] * inv_freq[None, :]
    return torch.cat((freqs.cos() * scaling, freqs.sin() * scaling), dim=-1)


class RotaryEmbedding(nn.Module):
    """Rotates q and k by position from a cos/sin cache ([max_position, rotary_dim] fp32).

    The cache is a plain attribute, not a buffer, so `model.to(dtype)` cannot cast it;
    it follows q to its device on first use. Length updates rewrite it in place, so
    CUDA graphs that read it stay valid.
    """

    def __init__(self, head_dim: int, rotary_dim: int, max_position: int, params: dict, dtype, is_neox: bool = True):
        super().__init__()
        if params.get("rope_type") not in ROPE_TYPES:
            raise ValueError(f"RoPE parameters need a rope_type in {ROPE_TYPES}; got {params!r}")
        if params["rope_type"] == "proportional":
            rotary_dim = head_dim  # zero frequencies past the rotated part leave those channels unchanged
        if rotary_dim % 2 or rotary_dim > head_dim:
            raise ValueError(f"rotary_dim {rotary_dim} must be even and at most head_dim {head_dim}")
        self.head_dim, self.rotary_dim, self.max_position = head_dim, rotary_dim, max_position
        self.params, self.dtype, self.is_neox = dict(params), dtype, is_neox
        self.rope_type = params["rope_type"]
        self.inv_freq, self.attention_scaling = compute_inv_freq(self.params, head_dim, rotary_dim)
        self.original_inv_freq = self.inv_freq
        self.cos_sin_cache = _cos_sin(self.inv_freq, max_position, self.attention_scaling, "cpu")
        self.original_len = params.get("original_max_position_embeddings", params.get("max_position_embeddings"))
        self.max_seq_len_cached = params.get("max_position_embeddings")  # dynamic: longest length seen
        self._long = False  # longrope: the long factors are in the cache

    @property
    def needs_length_update(self) -> bool:
        return self.rope_type in ("dynamic", "longrope")

    def update_for_length(self, seq_len: int) -> None:
        """Tell the module the current forward's max(position) + 1 (see the module docstring)."""
        if self.rope_type == "dynamic":
            cached, m = self.max_seq_len_cached, self.params["max_position_embeddings"]
            if seq_len > cached:  # growth: rescale the base for this length
                self.inv_freq, _ = compute_inv_freq(self.params, self.head_dim, self.rotary_dim, seq_len=seq_len)
                self.max_seq_len_cached = seq_len
                self._rebuild(min(seq_len, self.max_position))
            if seq_len < m and cached > m:  # back within the original length: the unscaled base
                self.inv_freq = self.original_inv_freq
                self.max_seq_len_cached = m
                self._rebuild(min(m, self.max_position))
        elif self.rope_type == "longrope":
            long = seq_len > self.original_len
            if long != self._long:
                self.inv_freq, _ = compute_inv_freq(self.params, self.head_dim, self.rotary_dim, seq_len=seq_len)
                self._long = long
                self._rebuild(self.max_position)

    def extend(self, max_position: int) -> None:
        """Grow the table to cover positions < max_position (an engine max_model_len above the config's)."""
        if max_position > self.max_position:
            self.max_position = max_position
            device = self.cos_sin_cache.device
            self.cos_sin_cache = _cos_sin(self.inv_freq, max_position, self.attention_scaling, device)

    def _rebuild(self, rows: int) -> None:
        cache = self.cos_sin_cache
        cache[:rows].copy_(_cos_sin(self.inv_freq, rows, self.attention_scaling, cache.device))

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [tokens]; q: [tokens, q_heads, head_dim] or [tokens, q_heads * head_dim]; k likewise
        if self.cos_sin_cache.device != q.device:
            self.cos_sin_cache = self.cos_sin_cache.to(q.device)
        q3 = q.view(q.shape[0], -1, self.head_dim)
        k3 = k.view(k.shape[0], -1, self.head_dim)
        q3, k3 = apply_rotary(q3, k3, positions, self.cos_sin_cache, self.rotary_dim, self.is_neox)
        return q3.view(q.shape), k3.view(k.shape)

    def extra_repr(self) -> str:
        return f"{self.rope_type}, rotary_dim={self.rotary_dim}/{self.head_dim}, max_position={self.max_position}"


@functools.cache
def _shared_rope(head_dim, rotary_dim, max_position, params_json, dtype, is_neox) -> RotaryEmbedding:
    return RotaryEmbedding(head_dim, rotary_dim, max_position, json.loads(params_json), dtype, is_neox)


def get_rope(
    head_dim: int,
    rotary_dim: int | None,
    max_position: int,
    rope_parameters: dict,
    dtype: torch.dtype,
    is_neox: bool = True,
) -> RotaryEmbedding:
    """The rotary embedding for one attention layer.

    Args:
        head_dim: channels per head.
        rotary_dim: channels that rotate (None: head_dim * partial_rotary_factor).
        max_position: rows of the cos/sin cache (the engine's max_model_len).
        rope_parameters: one flat dict from `rope_parameters_from_config`.
        dtype: the activations' dtype (the cache itself is fp32).
        is_neox: half-split pairing (Llama, Qwen, ...) or GPT-J interleaved pairing.
    Returns:
        A RotaryEmbedding; static types are shared by every caller with the same arguments,
        dynamic NTK gets a fresh module (it carries history: build one per model, share it by layer).
    """
    if rotary_dim is None:
        rotary_dim = int(head_dim * rope_parameters.get("partial_rotary_factor", 1.0))
    if rope_parameters.get("rope_type") == "dynamic":
        return RotaryEmbedding(head_dim, rotary_dim, max_position, rope_parameters, dtype, is_neox)
    params_json = json.dumps(rope_parameters, sort_keys=True)
    return _shared_rope(head_dim, rotary_dim, max_position, params_json, dtype, is_neox)


def _ropes(model: nn.Module) -> list[RotaryEmbedding]:
    unique = {id(m): m for m in model.modules() if isinstance(m, RotaryEmbedding)}
    return list(unique.values())


def extend_rope_tables(model: nn.Module, max_position: int) -> None:
    """Called once by the model runner after loading, with the engine's max_model_len."""
    for rope in _ropes(model):
        rope.extend(max_position)


def update_rope_for_length(model: nn.Module, seq_len: int) -> None:
    """Called by the model runner before each forward with max(position) + 1 over the batch."""
    for rope in _ropes(model):
        if rope.needs_length_update:
            rope.update_for_length(seq_len)
