"""FP8 (W8A8) projections: checkpoints that store float8_e4m3fn weights, and fp16/bf16 checkpoints quantized at
load (`--quantization fp8`).

Checkpoints read (each projection's `weight` [N, K] float8_e4m3fn plus `weight_scale`):
- `quant_method` "fp8" (AutoFP8, llm-compressor's FP8_DYNAMIC export in vLLM's format) with
  `activation_scheme` "dynamic": `weight_scale` one fp32 value per tensor;
- `compressed-tensors` format "float-quantized": weights 8-bit float, strategy "channel" (`weight_scale` [N, 1])
  or "tensor" ([1]); input activations 8-bit float, strategy "token", dynamic.
Every layer keeps one fp32 scale per output row (a per-tensor scale fills its rows), so the pieces of a fused
layer may carry different scales. Activations are quantized per token at run time (kernels/ops/fp8_linear.py).
Static activation scales, block-wise weight scales and e5m2 weights are refused.

Quantizing at load: each dense projection weight arriving from the checkpoint is quantized per output row
(its largest magnitude at e4m3's 448) into the same parameters.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from vlchat.kernels.ops.fp8_linear import FP8, fp8_linear, quantize_weight
from vlchat.llm.weights import WeightRule

QUANTIZE_AT_LOAD = "fp8"  # the one value of --quantization


@dataclass(frozen=True, slots=True)
class Fp8Config:
    """An FP8 W8A8 scheme: read from a checkpoint (`from_dense=False`) or applied at load (`from_dense=True`)."""

    from_dense: bool = False

    def param_shapes(self, in_features: int, out_features: int) -> dict:
        shapes = {"weight": ((out_features, in_features), FP8)}
        if not self.from_dense:
            shapes["weight_scale"] = ((out_features,), torch.float32)
        return shapes

    def buffer_shapes(self, in_features: int, out_features: int) -> dict:
        # quantized at load, the scales come with the weight, not from the checkpoint
        return {"weight_scale": ((out_features,), torch.float32)} if self.from_dense else {}

    def shard_dim(self, role: str) -> int:
        return 0  # rows of W, as in a 16-bit layer

    def input_dim(self, role: str) -> int | None:
        return 1 if role == "weight" else None  # per-row scales are whole on every rank

    def check_row_shard(self, in_per_rank: int, ranks: int) -> None:
        pass

    def forward(self, layer, rows: torch.Tensor) -> torch.Tensor:
        # rows: [tokens, in_features] -> [tokens, out_features]
        return fp8_linear(rows, layer.weight, layer.weight_scale, layer.bias)

    def checkpoint_rules(self) -> list[WeightRule]:
        return []

    def finish(self, layer) -> None:
        pass

    def to_kernel_layout(self, role: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        if role == "weight_scale":
            return {"weight_scale": tensor.to(torch.float32).reshape(-1)}
        if tensor.dtype == FP8:
            return {"weight": tensor}
        if not self.from_dense:
            raise ValueError(f"an FP8 checkpoint's weight must be {FP8}; got {tensor.dtype}")
        weight, scale = quantize_weight(tensor.to(torch.float32))
        return {"weight": weight, "weight_scale": scale}


def read_fp8_method(cfg: dict, refuse) -> Fp8Config:
    """`quant_method` "fp8": dynamic activations, per-tensor e4m3 weights."""
    if cfg.get("activation_scheme", "dynamic") != "dynamic":
        refuse(f"fp8 with activation_scheme {cfg.get('activation_scheme')!r} is not supported (only 'dynamic')")
    if cfg.get("weight_block_size"):
        refuse("fp8 with block-wise weight scales (weight_block_size) is not supported")
    if cfg.get("fmt", "e4m3") != "e4m3":
        refuse(f"fp8 format {cfg.get('fmt')!r} is not supported (only e4m3)")
    return Fp8Config()


def read_ct_fp8(groups: list[dict], refuse) -> Fp8Config:
    """compressed-tensors float-quantized groups: 8-bit float weights per channel or tensor, dynamic per token."""
    for group in groups:
        weights = group.get("weights") or {}
        inputs = group.get("input_activations") or {}
        if weights.get("type") != "float" or weights.get("num_bits") != 8:
            refuse(f"compressed-tensors float-quantized {weights.get('num_bits')}-bit {weights.get('type')} "
                   "weights are not supported")  # fmt: skip
        if weights.get("strategy") not in ("channel", "tensor") or weights.get("dynamic"):
            refuse(f"compressed-tensors FP8 weight strategy {weights.get('strategy')!r} is not supported")
        if inputs.get("type") != "float" or inputs.get("strategy") != "token" or not inputs.get("dynamic"):
            refuse("compressed-tensors FP8 without dynamic per-token FP8 activations is not supported")
        if group.get("output_activations"):
            refuse("compressed-tensors with quantized outputs is not supported")
    return Fp8Config()


def with_fp8_at_load(hf_config):
    """A copy of an unquantized checkpoint's config whose decoder projections are quantized to FP8 at load."""
    config = copy.deepcopy(hf_config)
    config.quantization_config = {"quant_method": "fp8", "activation_scheme": "dynamic", "vlchat_at_load": True}
    return config
