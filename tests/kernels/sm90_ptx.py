"""Compile the decode-step kernels for sm_90 with programmatic dependent launch (no GPU needed) and print, as one
JSON line, what each does before its griddepcontrol.wait: the global memory instructions and whether it lets
the next kernel launch. Run without TRITON_INTERPRET (test_dependent_launch.py does):

    python -m tests.kernels.sm90_ptx
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from vlchat.kernels.attention import decode, decode_ws, gluon_sm90, kv_write
from vlchat.kernels.attention.configs import TABLES
from vlchat.kernels.ops.activation import _act_and_mul_kernel
from vlchat.kernels.ops.fp8_linear import FP8_GEMV, _fp8_gemv_kernel
from vlchat.kernels.ops.linear import _gemv_kernel
from vlchat.kernels.ops.rms_norm import _rms_norm_kernel
from vlchat.kernels.ops.rotary import _rotary_kernel

FLOATS = ("scale", "softcap", "qk_scale", "eps", "weight_offset", "v_mul", "k_scale", "v_scale")
PTR_TYPES = {"tables_ptr": "*i32", "lens_ptr": "*i32", "part_ptr": "*fp32", "lse_ptr": "*fp32", "slots_ptr": "*i64",
             "pos_ptr": "*i64", "cache_ptr": "*fp32", "counters_ptr": "*i32"}  # fmt: skip
MEMORY_OP = re.compile(r"(ld\.global|st\.global|cp\.async\.bulk\.tensor\.\dd|cp\.async)")  # TMA: with its rank


def compiled_run(module: str) -> str:
    """stdout of `python -m module` run in a process of its own without TRITON_INTERPRET (compiled kernels, no GPU
    needed), from the repository root so that `tests` is importable; fails the calling test on a non-zero exit."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-m", module], env=env, capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def compile_ptx(fn, constexprs, descriptors=None, divisible=(), pointer_types=None, arch=90, **options) -> str:
    """PTX of `fn` for sm_`arch` (default 90, with dependent launch; ptxas runs too): pointers fp16 unless in
    PTR_TYPES or `pointer_types` (by name), descriptors given by name (a Gluon kernel), the rest int32 (FLOATS
    fp32); the arguments named in `divisible` multiples of 16, as Triton's launcher specializes them when they are
    (aligned pointers, sizes), which lets loads vectorize."""
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in (descriptors or {}):
            sig[name] = descriptors[name]
        elif name.endswith("_ptr"):
            sig[name] = {**PTR_TYPES, **(pointer_types or {})}.get(name, "*fp16")
        else:
            sig[name] = "fp32" if name in FLOATS else "i32"
    if descriptors:
        from triton.experimental.gluon._runtime import GluonASTSource as source
    else:
        source = ASTSource
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in divisible}
    src = source(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": 4, **options, "launch_pdl": arch >= 90}
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options).asm["ptx"]


def before_wait(ptx: str) -> dict:
    """The global memory instructions before the one griddepcontrol.wait, whether launch_dependents is among the
    instructions before it, and how many launch_dependents the kernel has. (In a warp-specialized Gluon kernel the
    text holds one partition after the other: "before" there is text order, not the order the warps run in.)"""
    lines = ptx.splitlines()
    waits = [i for i, line in enumerate(lines) if "griddepcontrol.wait" in line]
    if len(waits) != 1:
        raise AssertionError(f"expected one griddepcontrol.wait, found {len(waits)}")
    head = lines[: waits[0]]
    ops = [m.group(1) for m in map(MEMORY_OP.search, head) if m]
    return {
        "before": ops,
        "launches_dependents": any("griddepcontrol.launch_dependents" in line for line in head),
        "launches": sum("griddepcontrol.launch_dependents" in line for line in lines),
    }


def gluon_decode_args(config, head_dim=128) -> tuple[dict, dict]:
    """(constexprs, descriptor types) of a decode_ws launch at `config`: 8 sequences of 32 query heads over 8 KV
    heads, 16-token pages, 2 splits (partials, halving), dependent launch."""
    from triton.runtime.jit import mangle_type

    page = 16
    q = torch.empty(8, 32, head_dim, dtype=torch.float16)
    cache = torch.empty(64, page, 8, head_dim, dtype=torch.float16)
    q_desc, kc_desc, vc_desc = decode_ws.descriptors(q, cache, cache, config.block_n, config.pack_heads)
    descriptors = {"q_desc": mangle_type(q_desc), "kc_desc": mangle_type(kc_desc), "vc_desc": mangle_type(vc_desc)}
    return decode_ws.constexprs(32, 8, head_dim, page, config, num_splits=2, pdl=True), descriptors


def gluon_decode_ptx(config, head_dim=128) -> str:
    consts, descriptors = gluon_decode_args(config, head_dim)
    return compile_ptx(decode_ws._ws_decode_kernel, consts, descriptors, **decode_ws.launch_options(config))


def paged_read_ptx(config) -> str:
    """benchmarks/paged_read.py's read kernel (decode_ws's loader with a consumer that frees each buffer) at
    `config` (one KV head per CTA), compiled like gluon_decode_ptx's decode."""
    from benchmarks import paged_read

    consts, descriptors = gluon_decode_args(config)
    consts = {k: v for k, v in consts.items() if k in paged_read._read_kernel.arg_names}
    return compile_ptx(paged_read._read_kernel, consts, descriptors, **decode_ws.launch_options(config))


def main() -> None:
    consts = dict(GROUP=4, BLOCK_G=16, HEAD_DIM=128, BLOCK_D=128, PAGE=16, BLOCK_N=64, SOFTCAP=False, DIRECT=False,
                  QUANT=0, NATIVE_FP8=True, PRMT=True)  # fmt: skip
    report = {
        "decode": before_wait(compile_ptx(decode._decode_kernel, dict(consts, PRECISION="tf32", PDL=True), num_stages=4)),
        "reduce": before_wait(compile_ptx(decode._reduce_kernel, dict(HEAD_DIM=128, BLOCK_D=128, BLOCK_S=16, PDL=True))),
        "kv_write": before_wait(
            compile_ptx(kv_write._kv_write_kernel,
                        dict(KV_HEADS=8, HEAD_DIM=128, BLOCK_H=8, BLOCK_D=128, PAGE=16, QUANT=0, PDL=True))
        ),
        # the ops of a decode step (kernels/ops): the GEMV of one row at llama-1b's o_proj shape, and the small kernels
        "gemv": before_wait(
            compile_ptx(_gemv_kernel, dict(HAS_BIAS=False, BLOCK_N=8, BLOCK_K=1024, PDL=True),
                        divisible=("x_ptr", "w_ptr", "y_ptr", "N", "K", "stride_wn"))
        ),
        "rms_norm": before_wait(
            compile_ptx(_rms_norm_kernel, dict(HAS_RESIDUAL=True, X_SCALE=False, BLOCK=2048, PDL=True))
        ),
        "rotary": before_wait(
            compile_ptx(_rotary_kernel, dict(HEAD_DIM=64, ROT=64, IS_NEOX=True, BLOCK_H=32, BLOCK_D=64, PDL=True))
        ),
        "silu_and_mul": before_wait(compile_ptx(_act_and_mul_kernel, dict(ACT="silu", BLOCK=1024, PDL=True))),
    }  # fmt: skip
    fp8_gemv = compile_ptx(
        _fp8_gemv_kernel,
        dict(HAS_BIAS=False, BLOCK_M=16, BLOCK_N=FP8_GEMV.block_n, BLOCK_K=FP8_GEMV.block_k, SPLIT=True, CHUNK=8,
             PDL=True),
        divisible=("xq_ptr", "w_ptr", "xs_ptr", "ws_ptr", "K", "stride_xm", "stride_wn", "k_per_split"),
        pointer_types={"xq_ptr": "*fp8e4nv", "w_ptr": "*fp8e4nv", "xs_ptr": "*fp32", "ws_ptr": "*fp32",
                       "b_ptr": "*fp32"},
        num_warps=FP8_GEMV.num_warps, num_stages=FP8_GEMV.num_stages,
    )  # fmt: skip
    report["fp8_gemv"] = {
        **before_wait(fp8_gemv),
        "mma": sorted(set(re.findall(r"(?:wgmma\.mma_async|mma\.sync)\S*", fp8_gemv))),
        "async_16_byte_copies": len(re.findall(r"cp\.async\.cg\.shared\.global \[[^]]*\], \[[^]]*\], 0x10", fp8_gemv)),
    }
    if gluon_sm90.gluon is not None:
        for grid in ("one_wave", "waves", "long", "short"):
            name = "decode_ws" if grid == "one_wave" else f"decode_ws_{grid}"
            report[name] = before_wait(gluon_decode_ptx(TABLES["sm_90"].decode_ws_config(128, grid=grid)))
        report["decode_ws_256"] = before_wait(gluon_decode_ptx(TABLES["sm_90"].decode_ws_config(256), 256))
        packed = dataclasses.replace(TABLES["sm_90"].decode_ws_config(128, grid="waves"), pack_heads=4)
        report["decode_ws_waves_pack4"] = before_wait(gluon_decode_ptx(packed))
        report["paged_read"] = before_wait(paged_read_ptx(TABLES["sm_90"].decode_ws_config(128, grid="waves")))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
