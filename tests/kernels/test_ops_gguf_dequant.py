"""GGUF block dequantization (Q8_0, Q5_0, Q4_K, Q5_K, Q6_K): the torch reference and the Triton kernel
(interpreted on CPU, tiny shapes; a GPU runs 4096-column rows) against gguf-py's `dequantize`, the
reference the GGUF loader has always used. Random blocks with small finite fp16 scales cover every code,
scale and min bit pattern; fp32 results must be gguf-py's floats exactly on CPU (the GPU may contract a
multiply-add: 1e-6 relative)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import dequantize

from tests.kernels.attention_helpers import DEV, ON_GPU
from vlchat.kernels.ops.gguf_dequant import BLOCKS, dequantize_reference, dequantize_rows, dequantize_triton

FP16_AT = {Q.Q8_0: (0,), Q.Q5_0: (0,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}
TYPES = [Q.Q8_0, Q.Q5_0, Q.Q4_K, Q.Q5_K, Q.Q6_K]
ROWS, COLS = (64, 4096) if ON_GPU else (3, 512)


def random_blocks(rows: int, cols: int, qtype: Q, seed: int = 0) -> np.ndarray:
    elems, nbytes = BLOCKS[int(qtype)]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (rows * cols // elems, nbytes), dtype=np.uint8)
    for at in FP16_AT[qtype]:
        scale = rng.uniform(-1e-2, 1e-2, blocks.shape[0]).astype(np.float16)
        blocks[:, at : at + 2] = scale.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, cols // elems * nbytes)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_reference_equals_gguf(qtype):
    blocks = random_blocks(ROWS, COLS, qtype)
    want = torch.from_numpy(dequantize(blocks, qtype).copy())
    got = dequantize_reference(torch.from_numpy(blocks), int(qtype), COLS, torch.float32)
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_triton_kernel_equals_gguf(qtype, dtype):
    blocks = random_blocks(ROWS, COLS, qtype, seed=1)
    want = torch.from_numpy(dequantize(blocks, qtype).copy()).to(dtype)
    got = dequantize_triton(torch.from_numpy(blocks).to(DEV), int(qtype), COLS, dtype).cpu()
    if ON_GPU:
        torch.testing.assert_close(got, want, rtol=1e-6 if dtype == torch.float32 else 1e-3, atol=0)
    else:
        assert torch.equal(got, want)


def test_rows_of_a_matrix_dequantize_alone():
    """An embedding gathers rows of blocks and dequantizes only those: the same floats as the whole matrix's."""
    blocks = torch.from_numpy(random_blocks(8, 256, Q.Q4_K, seed=2))
    whole = dequantize_reference(blocks, int(Q.Q4_K), 256, torch.float32)
    ids = torch.tensor([5, 0, 5, 7])
    assert torch.equal(dequantize_rows(blocks[ids], int(Q.Q4_K), 256, torch.float32), whole[ids])


def test_bad_blocks_are_refused():
    with pytest.raises(ValueError, match="not kept quantized"):
        dequantize_rows(torch.zeros(1, 18, dtype=torch.uint8), int(Q.Q4_0), 32, torch.float32)
    with pytest.raises(ValueError, match=r"Q8_0 blocks of a 64-column matrix must be uint8 \[rows, 68\]"):
        dequantize_rows(torch.zeros(1, 34, dtype=torch.uint8), int(Q.Q8_0), 64, torch.float32)


@pytest.mark.parametrize(
    "qtype, cols",
    [(Q.Q8_0, 96), (Q.Q8_0, 288), (Q.Q5_0, 96), (Q.Q5_0, 288), (Q.Q4_K, 768), (Q.Q5_K, 2304), (Q.Q6_K, 768)],
    ids=lambda v: getattr(v, "name", f"cols{v}"),
)
def test_a_row_that_ends_inside_a_program_tile(qtype, cols):
    """Blocks are dequantized eight to a program: a row of 3 or 9 blocks ends inside a tile, whose blocks past
    the row's end are neither read nor written."""
    blocks = random_blocks(2, cols, qtype, seed=3)
    want = torch.from_numpy(dequantize(blocks, qtype).copy())
    got = dequantize_triton(torch.from_numpy(blocks).to(DEV), int(qtype), cols, torch.float32).cpu()
    if ON_GPU:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    else:
        assert torch.equal(got, want)
