"""Gluon (Triton's lower-level dialect) for the sm_90 kernels, where this Triton has it, and the TMA helpers they
share (`prefill_ws.py`, `decode_ws.py`).

`gluon` is None when Triton lacks Gluon's Hopper ops or is older than GLUON_MIN; the callers then keep their
Triton kernels. Gluon kernels do not run in the interpreter; their tests run on a GPU only.
"""

from __future__ import annotations

import functools

import torch
import triton

from vlchat.kernels.device import triton_version

# Triton 3.5's Gluon warp_specialize takes another signature; the kernels compile for sm_90 with 3.6 and 3.8 (and
# ran on the H200 with 3.6)
GLUON_MIN = (3, 6)


def gluon_usable(version: str) -> bool:
    """Whether a Triton of this version compiles the Gluon kernels."""
    return triton_version(version) >= GLUON_MIN


try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError:  # triton without Gluon's Hopper ops: the Triton kernels serve every call
    gluon = gl = fence_async_shared = mbarrier = tma = warpgroup_mma = warpgroup_mma_wait = TensorDescriptor = None
if not gluon_usable(triton.__version__):
    gluon = None


def on_sm90(device) -> bool:
    """Whether the Gluon kernels can run on `device` (a DeviceInfo): Gluon here and an sm_90 GPU (newer archs take
    sm_90's config tables, not these kernels)."""
    return gluon is not None and device.capability is not None and device.capability[0] == 9


LOG2E = 1.4426950408889634

TMA_PAGES = (16, 32, 64)  # page sizes the Gluon kernels read as TMA boxes (a box holds at most 64 rows here)


def tma_rows_ok(t) -> bool:
    """Rows of [..., heads, head_dim] with head_dim and heads contiguous, 16-byte aligned: a TMA-readable
    [tokens, heads * head_dim] view (`row_descriptor`)."""
    item = t.element_size()
    return (
        t.stride(-1) == 1 and t.stride(-2) == t.shape[-1] and (t.stride(-3) * item) % 16 == 0 and t.data_ptr() % 16 == 0
    )


def row_descriptor(t, block_rows, layout, memo: dict | None = None):
    """[tokens, heads * head_dim] view of rows [..., heads, head_dim] (a cache's blocks and pages flattened).

    With `memo`, a dict owned by whoever owns `t` (the attention layer, for its KV cache: `cache_memo` in
    decode.py), the descriptor is built once per tensor, box and layout and kept there (it holds `t`): building one
    costs microseconds of host time, and an eager step builds four per layer for the caches
    (docs/PERF.md#engine-and-host)."""
    head_dim, heads = t.shape[-1], t.shape[-2]

    def build():
        tokens = t.numel() // (heads * head_dim) if t.dim() == 4 else t.shape[0]
        return TensorDescriptor(t, [tokens, heads * head_dim], [t.stride(-3), 1], [block_rows, head_dim], layout)

    return kept(memo, t, (block_rows, layout), build)


def kept(memo: dict | None, t, box, build):
    """`build()`, a descriptor of `t` with this box, made once and kept in `memo` (without a memo, every call)."""
    if memo is None:
        return build()
    key = (t.data_ptr(), t.shape, t.stride(), t.dtype, box)
    desc = memo.get(key)
    if desc is None:
        desc = memo[key] = build()
    return desc


def gl_dtype(dtype):
    """Gluon's element type of a 2-byte torch dtype."""
    return gl.float16 if dtype == torch.float16 else gl.bfloat16


@functools.cache
def shared_layout(shape: tuple[int, ...], dtype: torch.dtype):
    """The NVMMA shared-memory layout of a TMA box of `shape` (NVMMASharedLayout.get_default_for), built once per
    shape and dtype: the launches build their descriptors every call, in eager steps once per layer, and a layout
    costs microseconds of host time to build (docs/PERF.md#engine-and-host)."""
    return gl.NVMMASharedLayout.get_default_for(list(shape), gl_dtype(dtype))


if gluon is not None:
    # A paged tile is read as one TMA box per page. Its pages are looked up in the block table together, a lane
    # each (one round trip for the tile, or for a group of tiles), and each box takes its page out of the lanes.

    @gluon.jit
    def load_page_lanes(table, first, last_page, ok, LANES: gl.constexpr):
        """The block-table entries of LANES boxes from box `first` on, a lane each; boxes past `last_page` repeat
        it; where `ok` is false, zeros (no load)."""
        boxes = gl.arange(0, LANES, layout=gl.BlockedLayout([1], [32], [1], [0]))
        return gl.load(table + gl.minimum(first + boxes, last_page), mask=(boxes >= 0) & ok, other=0)

    @gluon.jit
    def page_lane(pages, r):
        """Box r's page out of load_page_lanes' lanes."""
        boxes = gl.arange(0, pages.shape[0], layout=pages.type.layout)
        return gl.sum(gl.where(boxes == r, pages, 0), axis=0)

    @gluon.jit
    def issue_page_boxes(desc, pages, first, col, bar, buf, PAGE: gl.constexpr, RANK: gl.constexpr = 2):
        """One TMA box of PAGE rows (at column `col` of `desc`) per page of the lanes from `first` on, into
        consecutive row slices of the tile buffer `buf`, counted on `bar`. With RANK 3, `desc` is a
        [tokens, heads, head_dim] view and `col` the box's first head."""
        for r in gl.static_range(buf.shape[0] // PAGE):
            if RANK == 2:
                coord = [page_lane(pages, first + r) * PAGE, col]
            else:
                coord = [page_lane(pages, first + r) * PAGE, col, 0]
            tma.async_copy_global_to_shared(desc, coord, bar, buf.slice(r * PAGE, PAGE))

else:
    load_page_lanes = page_lane = issue_page_boxes = None
