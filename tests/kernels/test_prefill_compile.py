"""The prefill kernel with a split head (head_dim 80 as 64 + 16 columns, prefill.head_split) compiles (ptxas, no GPU
needed) with the arch tables' configs for sm_70, sm_75 and sm_90, where the interpreter cannot show that its second pair
of dots (K of 16 columns, an output of 16) lowers. The compiles run in a process of their own:

    python -m tests.kernels.test_prefill_compile
"""

from __future__ import annotations

import torch

from tests.kernels.sm90_ptx import compiled_run

ARCHS = {"sm_70": 70, "sm_75": 75, "sm_90": 90}


def test_the_split_head_prefill_compiles_for_old_and_new_arches():
    assert compiled_run("tests.kernels.test_prefill_compile").split() == ["sm_70-0", "sm_75-0", "sm_90-1"]


def compile_all() -> None:
    from tests.kernels.sm90_ptx import compile_ptx
    from vlchat.kernels.attention import prefill
    from vlchat.kernels.attention.configs import TABLES

    head_dim, dtype = 80, torch.float16
    first, second = prefill.head_split(head_dim)
    types = {n: "*fp16" for n in ("q_ptr", "k_ptr", "v_ptr", "kc_ptr", "vc_ptr", "out_ptr", "ksz_ptr", "vsz_ptr")}
    types.update({"cu_q_ptr": "*i32", "kv_lens_ptr": "*i32", "tables_ptr": "*i32"})
    for name, arch in ARCHS.items():
        config = TABLES[name].prefill_config(head_dim, dtype)
        constexprs = dict(GROUP=1, HEAD_DIM=head_dim, BLOCK_D=first, BLOCK_E=second, BLOCK_M=config.block_m,
                          BLOCK_N=config.block_n, PAGE=1, PAGED=False, ROWS=True, TMA=False, CAUSAL=False,
                          HAS_WINDOW=False, SOFTCAP=False, EVEN_D=True, PRECISION="tf32", HEADS_FIRST=True, QUANT=0,
                          SPLIT=True)  # fmt: skip
        ptx = compile_ptx(prefill._prefill_kernel, constexprs, pointer_types=types, arch=arch,
                          num_warps=config.num_warps, num_stages=config.num_stages)  # fmt: skip
        print(f"{name}-{int('wgmma.mma_async' in ptx)}", flush=True)


if __name__ == "__main__":
    compile_all()
