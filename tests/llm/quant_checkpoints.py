"""Tiny 4-bit checkpoints written the way GPTQ, AWQ and compressed-tensors publish them.

`quantize(w, group, sym, act_order)` rounds a weight [N, K] to 4-bit codes per group (round to nearest; zeros
kept in 1..15, which every format can store) and returns them with the weight they stand for. The writers pack
those codes by each format's published layout, written here independently of vlchat's loaders: GPTQ's and AWQ's
bit loops follow AutoGPTQ's and AutoAWQ's packers; compressed-tensors checkpoints are written by that library's
own compressor and config classes. `write_quantized_llama` saves a Llama checkpoint whose decoder projections
are quantized and returns the transformers model holding the dequantized weights (the reference).
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AWQ_PACK_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ's order_map for 4 bits


@dataclass
class Quantized:
    codes: torch.Tensor  # [N, K] int64 in 0..15
    scales: torch.Tensor  # [N, K // group] fp32
    zeros: torch.Tensor  # [N, K // group] int64 in 1..15 (8 when symmetric)
    g_idx: torch.Tensor  # [K] int32
    dequantized: torch.Tensor  # [N, K] fp32: (codes - zeros[:, g]) * scales[:, g]


def quantize(w: torch.Tensor, group: int, sym: bool, act_order: bool | str, seed: int = 0) -> Quantized:
    n, k = w.shape
    gen = torch.Generator().manual_seed(seed)
    if act_order == "irregular":  # groups of unequal sizes (no regrouping into runs of `group` rows exists)
        g_idx = torch.cat([torch.arange(k // group), torch.randint(0, k // group, (k - k // group,), generator=gen)])
        g_idx = g_idx[torch.randperm(k, generator=gen)].to(torch.int32)
    elif act_order:  # GPTQ's desc_act: groups follow a permutation of the input rows
        perm = torch.randperm(k, generator=gen)
        g_idx = (torch.argsort(perm) // group).to(torch.int32)
    else:
        g_idx = (torch.arange(k) // group).to(torch.int32)
    groups = k // group
    scales = torch.empty(n, groups)
    zeros = torch.empty(n, groups, dtype=torch.int64)
    for g in range(groups):
        cols = w[:, g_idx == g]
        if sym:
            scales[:, g] = cols.abs().amax(1).clamp_min(1e-6) / 7
            zeros[:, g] = 8
        else:
            lo, hi = cols.amin(1), cols.amax(1)
            scales[:, g] = ((hi - lo) / 14).clamp_min(1e-6)
            zeros[:, g] = torch.round(-lo / scales[:, g]).clamp(1, 15).long()
    gi = g_idx.long()
    codes = (torch.round(w / scales[:, gi]) + zeros[:, gi]).clamp(0, 15).long()
    dequantized = (codes - zeros[:, gi]).float() * scales[:, gi]
    return Quantized(codes, scales, zeros, g_idx, dequantized)


def _pack_rows(values: torch.Tensor) -> torch.Tensor:
    """AutoGPTQ's qweight packing: [K, N] -> [K // 8, N] int32, row 8r + j in bits 4j of word r."""
    k, n = values.shape
    out = torch.zeros(k // 8, n, dtype=torch.int64)
    for j in range(8):
        out |= (values[j::8] & 0xF) << (4 * j)
    return out.to(torch.int32)  # two's complement wrap of the top nibble


def _pack_columns(values: torch.Tensor, order: list[int]) -> torch.Tensor:
    """[rows, N] -> [rows, N // 8] int32, bits 4i of word c holding column 8c + order[i]."""
    rows, n = values.shape
    out = torch.zeros(rows, n // 8, dtype=torch.int64)
    for col in range(n // 8):
        for i in range(8):
            out[:, col] |= (values[:, col * 8 + order[i]] & 0xF) << (4 * i)
    return out.to(torch.int32)


def gptq_tensors(q: Quantized, v1: bool) -> dict[str, torch.Tensor]:
    stored_zeros = (q.zeros - 1) if v1 else q.zeros  # the "gptq" (v1) format stores zero - 1
    return {
        "qweight": _pack_rows(q.codes.T.contiguous()),
        "qzeros": _pack_columns(stored_zeros.T.contiguous(), list(range(8))),
        "scales": q.scales.T.contiguous(),
        "g_idx": q.g_idx,
    }


def awq_tensors(q: Quantized) -> dict[str, torch.Tensor]:
    return {
        "qweight": _pack_columns(q.codes.T.contiguous(), AWQ_PACK_ORDER),
        "qzeros": _pack_columns(q.zeros.T.contiguous(), AWQ_PACK_ORDER),
        "scales": q.scales.T.contiguous(),
    }


def ct_scheme(group: int, sym: bool):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    args = QuantizationArgs(num_bits=4, type="int", symmetric=sym, strategy="group", group_size=group)
    return QuantizationScheme(targets=["Linear"], weights=args)


def ct_tensors(q: Quantized, group: int, sym: bool) -> dict[str, torch.Tensor]:
    """compressed-tensors' own compressor packs the weight from its scales and (signed) zero points."""
    from compressed_tensors.compressors import PackedQuantizationCompressor

    state = {"weight": q.dequantized, "weight_scale": q.scales}
    if not sym:
        state["weight_zero_point"] = (q.zeros - 8).to(torch.int8)
    return dict(PackedQuantizationCompressor.compress(state, ct_scheme(group, sym)))


def ct_config(group: int, sym: bool) -> dict:
    from compressed_tensors.quantization import QuantizationConfig

    config = QuantizationConfig(
        config_groups={"group_0": ct_scheme(group, sym)}, format="pack-quantized", ignore=["lm_head"]
    )
    return config.to_dict()


def quantization_config(method: str, group: int, sym: bool, act_order: bool) -> dict:
    if method == "compressed-tensors":
        return ct_config(group, sym)
    if method == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"}
    return {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": bool(act_order), "sym": sym,
            "checkpoint_format": method}  # fmt: skip


def write_quantized_llama(out: Path, hf_model, method: str, group: int, sym: bool, act_order: bool, within: str = ""):
    """Save `hf_model` (a transformers decoder, or a VLM) with 4-bit decoder projections (those whose name
    contains `within`) in `method`'s layout ("gptq", "gptq_v2", "awq", "compressed-tensors") to `out`; load the
    dequantized weights into `hf_model` and return it (the reference the loaded checkpoint must match)."""
    out.mkdir(parents=True, exist_ok=True)
    state = {}
    with torch.no_grad():
        for name, param in hf_model.named_parameters():
            module, _, leaf = name.rpartition(".")
            if leaf != "weight" or module.rpartition(".")[2] not in PROJECTIONS or within not in module:
                state[name] = param.detach().clone()
                continue
            # projections of one input share GPTQ's act-order permutation (their inputs' Hessian is one)
            shared_input = (
                module.replace("k_proj", "q_proj").replace("v_proj", "q_proj").replace("up_proj", "gate_proj")
            )
            q = quantize(param, group, sym, act_order, seed=zlib.crc32(shared_input.encode()))
            param.copy_(q.dequantized)
            if method == "awq":
                tensors = awq_tensors(q)
            elif method == "compressed-tensors":
                tensors = ct_tensors(q, group, sym)
            else:
                tensors = gptq_tensors(q, v1=method == "gptq")
            state.update({f"{module}.{k}": v.contiguous() for k, v in tensors.items()})
    save_file(state, out / "model.safetensors")
    config = hf_model.config.to_dict()
    config["quantization_config"] = quantization_config(method, group, sym, act_order)
    config["dtype"] = "float32"
    config["architectures"] = [type(hf_model).__name__]
    (out / "config.json").write_text(json.dumps(config))
    return hf_model


def fp8_fake_quant_rows(x: torch.Tensor) -> torch.Tensor:
    """Per-token dynamic FP8 (e4m3) quantization of activations, back in fp32: the W8A8 schemes' input side."""
    scale = x.abs().amax(-1, keepdim=True) / 448.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (x / scale).to(torch.float8_e4m3fn).to(torch.float32) * scale


def fake_quantize_inputs(hf_model) -> None:
    """Make every decoder projection of `hf_model` quantize its input per token as W8A8 kernels do."""
    for name, module in hf_model.named_modules():
        if name.rpartition(".")[2] in PROJECTIONS:
            module.register_forward_pre_hook(lambda mod, args: (fp8_fake_quant_rows(args[0]),))


def write_fp8_llama(out: Path, hf_model, method: str):
    """Save `hf_model` with FP8 decoder projections: "fp8" (AutoFP8: one scale per tensor, written here) or
    "compressed-tensors" (FP8_DYNAMIC, one scale per row, written by that library). Returns `hf_model` holding the
    dequantized weights and quantizing its projections' inputs per token (the reference)."""
    out.mkdir(parents=True, exist_ok=True)
    state = {}
    if method == "compressed-tensors":
        from compressed_tensors.compressors import FloatQuantizationCompressor
        from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme

        scheme = preset_name_to_scheme("FP8_DYNAMIC", ["Linear"])
    with torch.no_grad():
        for name, param in hf_model.named_parameters():
            module, _, leaf = name.rpartition(".")
            if leaf != "weight" or module.rpartition(".")[2] not in PROJECTIONS:
                state[name] = param.detach().clone()
                continue
            if method == "fp8":
                scale = param.abs().max() / 448.0
                tensors = {"weight": (param / scale).to(torch.float8_e4m3fn), "weight_scale": scale.reshape(())}
                dequantized = tensors["weight"].float() * scale
            else:
                scale = param.abs().amax(1, keepdim=True) / 448.0  # [N, 1]
                tensors = dict(FloatQuantizationCompressor.compress({"weight": param, "weight_scale": scale}, scheme))
                dequantized = tensors["weight"].float() * tensors["weight_scale"].float()
            param.copy_(dequantized)
            state.update({f"{module}.{k}": v.contiguous() for k, v in tensors.items()})
    save_file(state, out / "model.safetensors")
    config = hf_model.config.to_dict()
    if method == "fp8":
        config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    else:
        qc = QuantizationConfig(config_groups={"group_0": scheme}, format="float-quantized", ignore=["lm_head"])
        config["quantization_config"] = qc.to_dict()
    config["dtype"] = "float32"
    config["architectures"] = [type(hf_model).__name__]
    (out / "config.json").write_text(json.dumps(config))
    fake_quantize_inputs(hf_model)
    return hf_model
