"""The W4A16 tl.dot GEMV compiles (ptxas, no GPU needed) for an arch without bf16 pairs and for sm_90, in both 16-bit
dtypes, and so does the half2 pairs GEMV (`_w4a16_gemv_pairs_kernel`, its one-row form): their inline PTX uses
instructions that older arches lack, and `inline_codes` must keep them from those. The compiles run in a process of
their own (compiled, not interpreted):

    python -m tests.kernels.test_quant_linear_compile
"""

from __future__ import annotations

import torch

from tests.kernels.attention_helpers import sim_device
from tests.kernels.sm90_ptx import compiled_run
from vlchat.kernels.device import TritonMode
from vlchat.kernels.ops.quant_linear import MAGIC, inline_codes

POINTERS = {"qw_ptr": "*i32", "z_ptr": "*u8", "g_ptr": "*i32", "part_ptr": "*fp32", "count_ptr": "*i32"}
ARCHS = ((7, 5), (9, 0))


def test_inline_codes_only_where_compiled_kernels_have_the_instructions():
    for cap in ((7, 0), (7, 5), (8, 0), (9, 0)):
        compiled = sim_device(cap, mode=TritonMode.COMPILED)
        assert inline_codes(compiled, torch.float16)
        assert inline_codes(compiled, torch.bfloat16) == (cap >= (8, 0))  # fma.rn.bf16x2 is sm_80's
        assert not inline_codes(sim_device(cap, mode=TritonMode.INTERPRETED), torch.float16)


def test_the_dot_gemv_compiles_for_old_and_new_arches():
    want = [f"sm{a}{b}-{d}" for a, b in ARCHS for d in ("float16", "bfloat16", "pairs")]
    assert compiled_run("tests.kernels.test_quant_linear_compile").split() == want


def compile_all() -> None:
    from tests.kernels.sm90_ptx import compile_ptx
    from vlchat.kernels.ops.quant_linear import _w4a16_gemv_kernel, _w4a16_gemv_pairs_kernel

    for cap in ARCHS:
        for dtype in (torch.float16, torch.bfloat16):
            name = str(dtype).removeprefix("torch.")
            constexprs = dict(GROUP=128, HAS_ZEROS=True, HAS_GIDX=False, HAS_BIAS=False, BLOCK_M=16, BLOCK_N=64,
                              BLOCK_K=128, DOT=True, MAGIC=MAGIC[dtype], SPLIT=True, CHUNK=8, TF32=False, PDL=False,
                              ASM=inline_codes(sim_device(cap, mode=TritonMode.COMPILED), dtype))  # fmt: skip
            elt = "*" + {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
            types = {**POINTERS, **{p: elt for p in ("x_ptr", "s_ptr", "b_ptr", "out_ptr")}}
            compile_ptx(_w4a16_gemv_kernel, constexprs, pointer_types=types, arch=cap[0] * 10 + cap[1])
            print(f"sm{cap[0]}{cap[1]}-{name}", flush=True)
        # the one-row half2 kernel (fp16 pairs: every arch from sm_53 has them)
        constexprs = dict(GROUP=128, HAS_ZEROS=True, HAS_BIAS=False, BLOCK_M=1, BLOCK_N=512, ROWS=8, SPLIT=True, CHUNK=8,
                          PDL=False, ASM=True)  # fmt: skip
        types = {**POINTERS, **{p: "*fp16" for p in ("x_ptr", "s_ptr", "b_ptr", "out_ptr")}}
        compile_ptx(_w4a16_gemv_pairs_kernel, constexprs, pointer_types=types, arch=cap[0] * 10 + cap[1])
        print(f"sm{cap[0]}{cap[1]}-pairs", flush=True)


if __name__ == "__main__":
    compile_all()
