"""The decode kernel over int8 and int4 caches compiles (ptxas, no GPU needed) with its byte-permute conversion
(`decode._codes` with PRMT: inline PTX, which the interpreter cannot run) with the oldest and the newest arch
tables' configs for the format, and the PTX holds the permutes (bf16 queries take the same fp16 dots over these
caches). The compiles run in a process of their own:

    python -m tests.kernels.test_decode_int_compile
"""

from __future__ import annotations

from tests.kernels.sm90_ptx import compiled_run

COMPILES = [("sm_70", 70, "int8", "fp16"), ("sm_80", 80, "int4", "bf16"), ("sm_90", 90, "int8", "fp16"),
            ("sm_90", 90, "int4", "fp16")]  # fmt: skip


def test_the_int_cache_decode_compiles_with_byte_permutes():
    lines = compiled_run("tests.kernels.test_decode_int_compile").split()
    assert [line.rsplit("-", 1)[0] for line in lines] == ["-".join((a, f, d)) for a, _, f, d in COMPILES]
    # two permutes per four codes, in K's and V's tiles
    assert all(int(line.rsplit("-", 1)[1]) >= 4 for line in lines), lines


def compile_all() -> None:
    import torch

    from tests.kernels.sm90_ptx import compile_ptx
    from vlchat.kernels.attention import decode, kv_quant
    from vlchat.kernels.attention.configs import TABLES

    types = {"q_ptr": "*fp16", "k_ptr": "*u8", "v_ptr": "*u8", "ksz_ptr": "*fp32", "vsz_ptr": "*fp32",
             "out_ptr": "*fp16"}  # fmt: skip
    for name, arch, fmt, label in COMPILES:
        dtype, ptr = (torch.float16, "*fp16") if label == "fp16" else (torch.bfloat16, "*bf16")
        config = TABLES[name].decode_config(128, dtype, fmt)
        constexprs = dict(GROUP=4, BLOCK_G=16, HEAD_DIM=128, BLOCK_D=128, PAGE=16, BLOCK_N=config.block_n,
                          SOFTCAP=False, DIRECT=False, PRECISION="tf32", PDL=arch >= 90,
                          QUANT=kv_quant.QUANT_CODES[fmt], NATIVE_FP8=False, PRMT=True)  # fmt: skip
        ptx = compile_ptx(decode._decode_kernel, constexprs, pointer_types=dict(types, q_ptr=ptr, out_ptr=ptr),
                          arch=arch, num_warps=config.num_warps, num_stages=config.num_stages)  # fmt: skip
        print(f"{name}-{fmt}-{label}-{ptx.count('0x64646464')}", flush=True)


if __name__ == "__main__":
    compile_all()
