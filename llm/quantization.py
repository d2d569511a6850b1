"""Quantized checkpoints: what a config's `quantization_config` asks for (`quant_config_from_hf`), and for 4-bit
weight-only ones (W4A16) how each published format's tensors become the one layout the kernel reads
(kernels/ops/quant_linear.py). FP8 checkpoints are read by llm/quant_fp8.py.

Formats, as Hugging Face checkpoints store one quantized `nn.Linear` of weight [N, K] with group size G:

- `gptq` (AutoGPTQ / GPTQModel, `checkpoint_format` "gptq" or "gptq_v2"): `qweight` [K/8, N] int32, codes packed
  along K, low nibble first (already the kernel's layout); `qzeros` [K/G, N/8] int32 packed along N, low nibble
  first, holding zero - 1 in the "gptq" (v1) format and the zero itself in "gptq_v2"; `scales` [K/G, N];
  `g_idx` [K], the group of each input row (only read with `desc_act`; without it the groups are k // G).
- `awq` (AutoAWQ, `version` "gemm"): `qweight` [K, N/8] int32 and `qzeros` [K/G, N/8] packed along N with the
  nibbles in the order 0 2 4 6 1 3 5 7 (nibble i holds column 8c + AWQ_ORDER[i]); `scales` [K/G, N].
- `compressed-tensors` `pack-quantized` (llm-compressor): `weight_packed` [N, K/8] int32 packed along K, low nibble
  first, holding code + 8 of a signed code; `weight_scale` [N, K/G]; `weight_zero_point` [N/8, K/G] packed along
  N the same way (asymmetric schemes only); `weight_shape` [2]; `weight_g_idx` [K] (group activation order).

Every format dequantizes as W[n, k] = (q - z) * s of the group of row k, with unsigned codes q in 0..15 and z = 8
for symmetric schemes that store no zeros. A linear layer built with a `QuantConfig` holds `qweight`, `scales`,
`zeros` (where the format has zero points) and `g_idx` (act-order) in the kernel's layout; `to_kernel_layout`
converts one checkpoint tensor (one piece of a fused layer) into it, and `checkpoint_rules` renames the format's
tensor names onto those parameters. Decoder projections are quantized; the LM head, embeddings and vision towers
stay 16-bit. Anything else a config asks for raises `UnsupportedQuantizationError` naming what is supported.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vlchat.kernels.ops.quant_linear import GROUP_SIZES, pack_int4, unpack_int4, w4a16_linear
from vlchat.llm.errors import ModelLoadError, TensorParallelError
from vlchat.llm.weights import WeightRule

METHODS = ("gptq", "awq", "compressed-tensors")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
SUPPORTED = (
    "4-bit weight-only (W4A16) checkpoints with group size 32, 64 or 128: quant_method 'gptq' (checkpoint_format "
    "gptq or gptq_v2, sym or asym, with or without desc_act), 'awq' (version gemm, zero_point true) and "
    "'compressed-tensors' (format pack-quantized, int weights, strategy group, no activation quantization); "
    "and FP8 W8A8 checkpoints: quant_method 'fp8' (e4m3, activation_scheme dynamic) and 'compressed-tensors' "
    "(format float-quantized, channel or tensor weight scales, dynamic per-token activations)"
)
# decoder projections, as checkpoints name them: a config that leaves one of these unquantized is refused
_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class UnsupportedQuantizationError(ModelLoadError):
    """The checkpoint's quantization_config asks for a method, bit width or layout vlchat cannot run."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what}; vlchat runs {SUPPORTED}. Use one of those or the unquantized checkpoint")


@dataclass(frozen=True, slots=True)
class QuantConfig:
    """One checkpoint's 4-bit scheme, read from its `quantization_config` (`quant_config_from_hf`)."""

    method: str  # one of METHODS
    group_size: int
    has_zeros: bool  # the checkpoint stores zero points (else every zero is 8)
    act_order: bool  # the checkpoint's g_idx tensors give each input row's group
    zero_offset: int = 0  # added to stored zeros (GPTQ v1 stores zero - 1)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise UnsupportedQuantizationError(f"quant_method {self.method!r} is not supported")
        if self.group_size not in GROUP_SIZES:
            raise UnsupportedQuantizationError(f"group size {self.group_size} is not supported")

    def param_shapes(self, in_features: int, out_features: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """The layer's parameters in the kernel's layout: role -> (shape, dtype); None dtype = the model's."""
        if in_features % self.group_size:
            raise UnsupportedQuantizationError(
                f"a layer of {in_features} inputs does not split into groups of {self.group_size}"
            )
        groups = in_features // self.group_size
        shapes = {"qweight": ((in_features // 8, out_features), torch.int32),
                  "scales": ((groups, out_features), None)}  # fmt: skip
        if self.has_zeros:
            shapes["zeros"] = ((groups, out_features), torch.uint8)
        if self.act_order:
            shapes["g_idx"] = ((in_features,), torch.int32)
        return shapes

    def buffer_shapes(self, in_features: int, out_features: int) -> dict:
        return {}

    def shard_dim(self, role: str) -> int:
        """The dimension along which a fused layer's pieces lie (the output columns)."""
        return 1

    def input_dim(self, role: str) -> int | None:
        """The dimension a row-parallel layer splits by input: codes by rows of 8, scales and zeros by group."""
        return 0

    def check_row_shard(self, in_per_rank: int, ranks: int) -> None:
        """Refuse a row-parallel split whose shards would not hold whole groups, or an act-order layer's."""
        if self.act_order:
            raise TensorParallelError(
                f"{self.method} act-order (g_idx / desc_act) 4-bit weights cannot be split by input over "
                f"tensor_parallel_size={ranks}: a rank's inputs would need other ranks' groups; serve it with "
                "tensor_parallel_size=1 or use a checkpoint quantized without act-order"
            )
        if in_per_rank % self.group_size:
            raise TensorParallelError(
                f"a row-parallel layer's {in_per_rank} inputs per rank (tensor_parallel_size={ranks}) are not whole "
                f"groups of {self.group_size}; pick a tensor_parallel_size that splits the groups evenly"
            )

    def forward(self, layer, rows: torch.Tensor) -> torch.Tensor:
        # rows: [tokens, in_features] -> [tokens, out_features]; act-order layers regrouped at load read their
        # input columns in the order of their sorted rows
        perm = getattr(layer, "input_order", None)
        if perm is not None:
            rows = rows[:, perm]
        return w4a16_linear(rows, layer.qweight, layer.scales, layer.zeros, layer.g_idx, self.group_size, layer.bias)

    def finish(self, layer) -> None:
        """Once loaded, an act-order layer whose groups each hold `group_size` input rows is regrouped: its rows
        sorted by group (codes repacked), the order kept as `input_order` and g_idx dropped, so the kernel reads one
        row of scales per K step instead of gathering them per row. Other g_idx stay as loaded."""
        if layer.g_idx is None:
            return
        g_idx = layer.g_idx.data
        order = torch.sort(g_idx.to(torch.int64), stable=True).indices
        k = g_idx.numel()
        if not torch.equal(g_idx[order].long(), torch.arange(k, device=g_idx.device) // self.group_size):
            return
        layer.qweight.data = pack_int4(unpack_int4(layer.qweight.data)[order])
        layer.register_buffer("input_order", order)
        layer.g_idx = None

    def checkpoint_rules(self) -> list[WeightRule]:
        """Renames of the format's tensor names onto the layer's parameters (and drops of what it does not use)."""
        if self.method == "compressed-tensors":
            return [
                WeightRule(r"\.weight_packed$", ".qweight"),
                WeightRule(r"\.weight_scale$", ".scales"),
                WeightRule(r"\.weight_zero_point$", ".zeros"),
                WeightRule(r"\.weight_g_idx$", ".g_idx"),
                WeightRule(r"\.weight_shape$", None),  # the packed tensor's shape already says N and K
            ]
        rules = [WeightRule(r"\.qzeros$", ".zeros")]
        if self.method == "gptq" and not self.act_order:
            rules.append(WeightRule(r"\.g_idx$", None))  # k // group without desc_act
        return rules

    def to_kernel_layout(self, role: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        """One checkpoint tensor (a whole layer or one piece of a fused one) in the kernel's layout, by role."""
        return {role: self._convert(role, tensor)}

    def _convert(self, role: str, tensor: torch.Tensor) -> torch.Tensor:
        if role == "g_idx":
            return tensor.to(torch.int32)
        if self.method == "gptq":  # qweight is the kernel's layout already
            if role == "zeros":
                return self._zeros(_unpack_along_n(tensor))
            return _int32(tensor) if role == "qweight" else tensor
        if self.method == "awq":
            if role == "scales":
                return tensor
            codes = _unpack_along_n(tensor, AWQ_ORDER)  # [rows, N]
            return pack_int4(codes) if role == "qweight" else self._zeros(codes)
        # compressed-tensors keeps the output first ([N, ...], zeros packed along N): the kernel wants it last
        if role == "qweight":
            return _int32(tensor).T.contiguous()
        if role == "scales":
            return tensor.T.contiguous()
        return self._zeros(_unpack_along_n(_int32(tensor).T))

    def _zeros(self, codes: torch.Tensor) -> torch.Tensor:
        return (codes.to(torch.int32) + self.zero_offset).to(torch.uint8)


def _int32(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dtype != torch.int32:
        raise ValueError(f"packed 4-bit codes must be int32; got {tensor.dtype}")
    return tensor


def _unpack_along_n(packed: torch.Tensor, order=tuple(range(8))) -> torch.Tensor:
    """[rows, N/8] int32 -> [rows, N] codes; nibble i of word c is column 8c + order[i]."""
    packed = _int32(packed)
    shifts = torch.tensor([4 * order.index(j) for j in range(8)], dtype=torch.int32)  # column 8c + j's nibble
    codes = (packed[:, :, None] >> shifts[None, None, :]) & 0xF  # [rows, N/8, 8]
    return codes.reshape(packed.shape[0], -1).to(torch.uint8)


def _plain(quantization_config) -> dict:
    if hasattr(quantization_config, "to_dict"):
        return quantization_config.to_dict()
    return dict(quantization_config)


def quant_config_from_hf(hf_config):
    """The checkpoint's scheme (a QuantConfig, or an Fp8Config from llm/quant_fp8.py), None for an unquantized
    one; anything else is refused with the reason."""
    from vlchat.llm import quant_fp8

    raw = getattr(hf_config, "quantization_config", None)
    if raw is None:
        return None
    cfg = _plain(raw)
    method = str(cfg.get("quant_method", "")).lower()
    if method == "gguf":  # set by load_model for a GGUF file served from its blocks
        from vlchat.llm.gguf_layers import GGUFConfig

        return GGUFConfig(torch.get_default_dtype())
    if method == "gptq":
        return _gptq(cfg)
    if method == "awq":
        return _awq(cfg)
    if method == "fp8":
        if cfg.get("vlchat_at_load"):
            return quant_fp8.Fp8Config(from_dense=True)
        return quant_fp8.read_fp8_method(cfg, _refuse)
    if method == "compressed-tensors":
        groups = list((cfg.get("config_groups") or {}).values())
        _check_kv_cache_scheme(cfg.get("kv_cache_scheme"))
        if not groups and cfg.get("kv_cache_scheme"):  # only the KV cache is quantized: 16-bit weights
            return None
        if groups and all((g.get("format") or cfg.get("format")) == "float-quantized" for g in groups):
            _check_unquantized(cfg.get("ignore"), "ignore")
            return quant_fp8.read_ct_fp8(groups, _refuse)
        return _compressed_tensors(cfg)
    raise UnsupportedQuantizationError(f"quant_method {method or None!r} is not supported")


def _check_kv_cache_scheme(scheme) -> None:
    """A compressed-tensors `kv_cache_scheme` must be FP8 with symmetric scales (the checkpoint's k_scale/v_scale,
    read by weights.load_tensors, are the fp8 cache's scales under --kv-cache-dtype fp8)."""
    if not scheme:
        return
    scheme = _plain(scheme)
    if scheme.get("type") != "float" or scheme.get("num_bits") != 8 or not scheme.get("symmetric", True):
        raise UnsupportedQuantizationError(
            f"kv_cache_scheme {scheme.get('num_bits')}-bit {scheme.get('type')}"
            f"{'' if scheme.get('symmetric', True) else ' asymmetric'} is not supported (only symmetric 8-bit float, "
            "served with --kv-cache-dtype fp8)"
        )


def _refuse(what: str):
    raise UnsupportedQuantizationError(what)


def _check_bits(bits, method: str) -> None:
    if bits != 4:
        raise UnsupportedQuantizationError(f"{method} with {bits}-bit weights is not supported")


def _check_unquantized(names, key: str) -> None:
    """Modules a config leaves unquantized: the head, embeddings and vision parts may be; decoder projections not."""
    for name in names or ():
        if any(p in str(name) for p in _PROJECTIONS):
            raise UnsupportedQuantizationError(f"{key} leaves the decoder projection {name!r} unquantized")


def _gptq(cfg: dict) -> QuantConfig:
    _check_bits(cfg.get("bits"), "gptq")
    fmt = cfg.get("checkpoint_format") or cfg.get("format") or "gptq"
    if fmt not in ("gptq", "gptq_v2"):
        raise UnsupportedQuantizationError(f"gptq checkpoint_format {fmt!r} is not supported")
    if cfg.get("lm_head"):
        raise UnsupportedQuantizationError("gptq with a quantized lm_head is not supported")
    if cfg.get("dynamic"):
        raise UnsupportedQuantizationError("gptq with per-module overrides ('dynamic') is not supported")
    _check_unquantized(cfg.get("modules_to_not_convert"), "modules_to_not_convert")
    return QuantConfig("gptq", int(cfg.get("group_size", 0)), has_zeros=True, act_order=bool(cfg.get("desc_act")),
                       zero_offset=1 if fmt == "gptq" else 0)  # fmt: skip


def _awq(cfg: dict) -> QuantConfig:
    _check_bits(cfg.get("bits", cfg.get("w_bit")), "awq")
    version = str(cfg.get("version", "gemm")).lower()
    if version != "gemm":
        raise UnsupportedQuantizationError(f"awq version {version!r} is not supported")
    if not cfg.get("zero_point", True):
        raise UnsupportedQuantizationError("awq without zero points is not supported")
    _check_unquantized(cfg.get("modules_to_not_convert"), "modules_to_not_convert")
    group = cfg.get("group_size", cfg.get("q_group_size", 0))
    return QuantConfig("awq", int(group), has_zeros=True, act_order=False)


def _compressed_tensors(cfg: dict) -> QuantConfig:
    groups = list((cfg.get("config_groups") or {}).values())
    if not groups:
        raise UnsupportedQuantizationError("compressed-tensors without config_groups is not supported")
    schemes = []
    for group in groups:
        fmt = group.get("format") or cfg.get("format")
        if fmt != "pack-quantized":
            raise UnsupportedQuantizationError(f"compressed-tensors format {fmt!r} is not supported")
        weights = group.get("weights") or {}
        if group.get("input_activations") or group.get("output_activations"):
            raise UnsupportedQuantizationError("compressed-tensors with quantized activations is not supported")
        if weights.get("type", "int") != "int":
            raise UnsupportedQuantizationError(f"compressed-tensors {weights.get('type')} weights are not supported")
        _check_bits(weights.get("num_bits"), "compressed-tensors")
        if weights.get("strategy") != "group" or weights.get("dynamic"):
            raise UnsupportedQuantizationError(
                f"compressed-tensors strategy {weights.get('strategy')!r} is not supported (only 'group', static)"
            )
        schemes.append((int(weights.get("group_size") or 0), not weights.get("symmetric", True),
                        weights.get("actorder") == "group"))  # fmt: skip
    if len(set(schemes)) > 1:
        raise UnsupportedQuantizationError("compressed-tensors with several different weight schemes is not supported")
    _check_unquantized(cfg.get("ignore"), "ignore")
    group_size, has_zeros, act_order = schemes[0]
    return QuantConfig("compressed-tensors", group_size, has_zeros=has_zeros, act_order=act_order)
