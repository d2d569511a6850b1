"""Programmatic dependent launch of the decode kernels: where it is used, and that a decode launched this way
still reads what the kernels before it wrote (the KV write's new rows, the split partials for the reduce)."""

import json
from dataclasses import replace

import pytest
import torch
import triton
import triton.language as tl

from tests.kernels.attention_helpers import ARCHS, DEV, ON_GPU, assert_close, make_paged, needs_sm90, sim_device
from tests.kernels.sm90_ptx import compiled_run
from vlchat.kernels.attention import carveout, decode, decode_ws, gluon_sm90, kv_write, pdl, reference
from vlchat.kernels.attention.configs import TABLES
from vlchat.kernels.attention.pdl import gdc_launch_dependents
from vlchat.kernels.device import DeviceInfo, TritonMode, device_for
from vlchat.kernels.ops.fp8_linear import FP8_GEMV

SM90_GPU = ON_GPU and torch.cuda.get_device_capability()[0] >= 9
needs_pdl = pytest.mark.skipif(not SM90_GPU, reason="griddepcontrol needs an sm_90 (or newer) GPU")


def test_only_compiled_kernels_on_sm90_and_newer_launch_dependent(monkeypatch):
    for arch, cap in ARCHS.items():
        assert pdl.dependent_launch(sim_device(cap, mode=TritonMode.COMPILED)) == (arch == "sm_90")
    assert pdl.dependent_launch(sim_device((10, 0), mode=TritonMode.COMPILED))  # takes sm_90's table
    assert not pdl.dependent_launch(sim_device((9, 0), mode=TritonMode.INTERPRETED))  # no griddepcontrol
    assert not pdl.dependent_launch(DeviceInfo("cpu", "cpu", None, 2, 0, 0, True, TritonMode.INTERPRETED))
    assert [arch for arch, table in TABLES.items() if table.pdl] == ["sm_90"]
    monkeypatch.setattr(pdl, "gdc_wait", None)  # a Triton older than 3.4: no griddepcontrol
    assert not pdl.dependent_launch(sim_device((9, 0), mode=TritonMode.COMPILED))


@pytest.fixture(scope="module")
def sm90_ptx():
    """What the kernels compiled for sm_90 with dependent launch do before griddepcontrol.wait (tests/kernels/
    sm90_ptx.py, run in a process of its own: compiled, not interpreted, and no GPU needed)."""
    return json.loads(compiled_run("tests.kernels.sm90_ptx").splitlines()[-1])


def test_decode_kernels_wait_for_the_previous_kernel_before_reading_its_output(sm90_ptx):
    """Before griddepcontrol.wait the Triton decode kernel loads only the sequence length and the Gluon one
    lengths, the first group of tiles' pages (the engine's inputs) and one tile's K/V rows (2-D TMA boxes, rows
    that no kernel of the step writes: the test below), not the query (its 3-D box) and no store; the reduce and
    the KV write read nothing before it and let the next kernel launch first. The Triton decode lets the reduce
    launch only by ending; the Gluon one has one launch_dependents, in its consumer's loop (at the last tile,
    decode_ws.py: where is a matter of time only, the reduce waits for the whole grid whatever its CTAs signal)."""
    assert sm90_ptx["decode"] == {"before": ["ld.global"], "launches_dependents": False, "launches": 0}
    assert sm90_ptx["reduce"] == {"before": [], "launches_dependents": True, "launches": 1}
    assert sm90_ptx["kv_write"] == {"before": [], "launches_dependents": True, "launches": 1}
    if gluon_sm90.gluon is not None:
        # the one-CTA and the two-CTA configs at head_dim 128 (the latter also halving its splits, decode_ws_long,
        # and at 168 registers, decode_ws_short), and head_dim 256's (Gemma 3): one 64-key tile, 4 pages of 16
        # rows, K and V, each row as 64-column boxes (a box row holds at most the 128 bytes of its swizzle: two
        # boxes at head_dim 128, four at 256); more tiles before the wait measured slower (decode_ws.py)
        configs = (("decode_ws", 2), ("decode_ws_waves", 2), ("decode_ws_long", 2), ("decode_ws_short", 2),
                   ("decode_ws_256", 4))  # fmt: skip
        for config, boxes in configs:
            assert set(sm90_ptx[config]["before"]) == {"ld.global", "cp.async.bulk.tensor.2d"}
            assert sm90_ptx[config]["before"].count("cp.async.bulk.tensor.2d") == 4 * 2 * boxes
            assert sm90_ptx[config]["launches"] == 1
        # 4 KV heads per CTA: the first tile is one 16-token page of the 4 heads, K and V, each a 3-D box as two
        # 64-column halves; the query's box (3-D too) after the wait
        packed = sm90_ptx["decode_ws_waves_pack4"]
        assert packed["before"] == ["ld.global"] * 3 + ["cp.async.bulk.tensor.3d"] * 4 and packed["launches"] == 1
        # benchmarks/paged_read.py's read kernel runs the decode's own loader (it compiles against its signature):
        # the same loads before the wait, and no consumer that lets the next kernel launch
        assert sm90_ptx["paged_read"]["before"] == sm90_ptx["decode_ws_waves"]["before"]
        assert sm90_ptx["paged_read"]["launches"] == 0


def test_decode_step_ops_wait_before_reading_the_previous_kernels_output(sm90_ptx):
    """The GEMV (kernels/ops/linear.py) loads only its first weight tile before griddepcontrol.wait: 8 rows x 1024
    fp16 columns, 8 16-byte loads a thread; its input row after it. RMSNorm, rotary and SiLU-and-mul read nothing
    before it. Each lets the next kernel launch at its start, so a GEMV after it reads weights while it runs."""
    assert sm90_ptx["gemv"] == {"before": ["ld.global"] * 8, "launches_dependents": True, "launches": 1}
    for op in ("rms_norm", "rotary", "silu_and_mul"):
        assert sm90_ptx[op] == {"before": [], "launches_dependents": True, "launches": 1}, op


def test_fp8_gemv_multiplies_on_tensor_cores_after_the_wait(sm90_ptx):
    """The FP8 GEMV (kernels/ops/fp8_linear.py) reads nothing before griddepcontrol.wait (its x is the quantizing
    kernel's output). Its 32-row weight tiles are below the warpgroup MMA's 64, so Triton multiplies the e4m3 values
    as fp16 (exact) on the warp-level MMA with fp32 sums. Its tiles arrive by 16-byte asynchronous copies,
    pipelined: a stage is 8 copies of the 32 x 512 weight tile and 4 of x's 16 x 512, per thread, in the table's
    number of stages."""
    gemv = sm90_ptx["fp8_gemv"]
    assert gemv["before"] == [] and gemv["launches_dependents"] and gemv["launches"] == 1
    assert gemv["mma"] == ["mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"]
    assert (FP8_GEMV.block_n, FP8_GEMV.block_k) == (32, 512)
    assert gemv["async_16_byte_copies"] == (8 + 4) * FP8_GEMV.num_stages


@needs_pdl
@pytest.mark.parametrize("kernel", [pytest.param("gluon", marks=needs_sm90), "triton"])
@pytest.mark.parametrize("splits", [1, 8])
def test_decode_right_after_the_kv_write_reads_the_new_rows(kernel, splits):
    """The engine's order: the step's K/V rows are written, then attended at once; the KV write lets the decode
    start early. The slots hold rows far from the new ones, so stale reads would show in the output. (The window
    is short: on the H200 this test also passed with the decode's waits removed; the PTX tests above keep them.)"""
    assert pdl.dependent_launch(device_for(torch.empty(1, device=DEV)))
    torch.manual_seed(0)
    kv_heads, q_heads, head_dim, page, dtype = 8, 32, 128, 16, torch.float16
    table = TABLES["sm_90"]
    config = table.decode_ws_config(head_dim) if kernel == "gluon" else table.decode_config(head_dim)
    batch = 6
    lens = [300 + 37 * i for i in range(batch)]
    k_cache, v_cache, tables = make_paged(lens, page, kv_heads, head_dim, dtype)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    rows = torch.tensor([n - 1 for n in lens], device=DEV)
    slots = tables.long().gather(1, (rows // page)[:, None])[:, 0] * page + rows % page  # each sequence's last row
    scale = head_dim**-0.5
    for _ in range(8):
        k_cache.view(-1, kv_heads, head_dim)[slots] = 20.0  # stale rows: they would dominate the softmax
        v_cache.view(-1, kv_heads, head_dim)[slots] = 1000.0
        q = torch.randn(batch, q_heads, head_dim, device=DEV, dtype=dtype)
        k_new = torch.randn(batch, kv_heads, head_dim, device=DEV, dtype=dtype)
        v_new = torch.randn_like(k_new)
        kv_write.write_kv_cache(k_new, v_new, k_cache, v_cache, slots)
        out = decode.paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, scale, None, splits, config=config)
        ref = reference.paged_decode_attention(q.double(), k_cache.double(), v_cache.double(), tables, seq_lens, scale)
        assert_close(out, ref, dtype)


@triton.jit
def _globaltimer():
    """The GPU's nanosecond clock."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _late_row_write_kernel(k_ptr, v_ptr, offset, k_value, v_value, DELAY_NS: tl.constexpr, N: tl.constexpr):
    """A slow KV write: lets the next kernel launch at once, waits DELAY_NS, then writes one K and one V row."""
    gdc_launch_dependents()
    now = _globaltimer()
    end = now + DELAY_NS
    while now < end:
        now = _globaltimer()
    cols = tl.arange(0, N)
    tl.store(k_ptr + offset + cols, tl.full([N], k_value, k_ptr.dtype.element_ty))
    tl.store(v_ptr + offset + cols, tl.full([N], v_value, v_ptr.dtype.element_ty))


@needs_sm90
@pytest.mark.parametrize("length", [64, 300, 4096])
def test_the_gluon_decode_reads_the_last_row_after_the_wait_however_late_it_is_written(length):
    """The Gluon decode loads a split's first tile before its dependent-launch wait, except the tile holding the
    sequence's last row (decode_ws.py): the only row a decode step's KV write changes. Here the kernel before the
    decode writes that row 50 ms after letting the decode launch (enqueuing the decode takes well under 1 ms), long
    after the early loads: the decode must still see the new row (stale, it would dominate the softmax). With 4
    splits the last row lies in a split's only tile (64), in a tile partly past the end (300) and in the last of a
    split's 16 tiles (4096). On the H200 the 64 and 300 cases failed with the first tile loaded early regardless."""
    assert pdl.dependent_launch(device_for(torch.empty(1, device=DEV)))
    torch.manual_seed(2)
    kv_heads, q_heads, head_dim, page, dtype = 8, 32, 128, 16, torch.float16
    k_cache, v_cache, tables = make_paged([length], page, kv_heads, head_dim, dtype)
    seq_lens = torch.tensor([length], dtype=torch.int32, device=DEV)
    q = torch.randn(1, q_heads, head_dim, device=DEV, dtype=dtype)
    row = length - 1
    block = int(tables[0, row // page])
    kvh = 3  # the KV head whose row turns up late
    offset = k_cache[block, row % page, kvh].data_ptr() - k_cache.data_ptr()
    k_cache[block, row % page, kvh] = 20.0  # stale: it would dominate the softmax
    v_cache[block, row % page, kvh] = 1000.0
    config = TABLES["sm_90"].decode_ws_config(head_dim)
    device = device_for(q)
    assert decode_ws.available(device, q_heads // kv_heads, page) and decode_ws.supports(q, k_cache, v_cache, None)

    def attend():
        return decode.paged_decode_attention(
            q, k_cache, v_cache, tables, seq_lens, head_dim**-0.5, None, 4, config=config
        )

    attend()  # compiled and loaded: the timed call below launches within microseconds of the writer
    torch.cuda.synchronize()
    _late_row_write_kernel[(1,)](
        k_cache, v_cache, offset // k_cache.element_size(), 0.5, -2.0, DELAY_NS=50_000_000, N=head_dim,
        **pdl.pdl_options(True),
    )  # fmt: skip
    out = attend()
    torch.cuda.synchronize()
    assert float(k_cache[block, row % page, kvh, 0]) == 0.5  # the late row is in place now
    ref = reference.paged_decode_attention(
        q.double(), k_cache.double(), v_cache.double(), tables, seq_lens, head_dim**-0.5
    )
    assert_close(out, ref, dtype)


@needs_pdl
def test_dependent_launch_changes_no_result_bit():
    torch.manual_seed(1)
    lens = [4096, 1000, 17]
    k_cache, v_cache, tables = make_paged(lens, 16, 8, 128, torch.bfloat16)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    q = torch.randn(3, 32, 128, device=DEV, dtype=torch.bfloat16)

    def run():
        return decode.paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, 0.09, None, 16)

    assert pdl.dependent_launch(device_for(q))
    dependent = run()
    with pdl.without_dependent_launch(device_for(q)):
        assert not pdl.dependent_launch(device_for(q))
        plain = run()
    assert torch.equal(dependent, plain)


@needs_pdl
def test_the_reduce_launched_early_prefers_the_most_shared_memory():
    """The reduce kernel launched with dependent launch asks for the largest shared-memory carveout (so that the
    next decode's CTAs can start beside it, carveout.py); launched without, it keeps CUDA's choice."""
    part = torch.randn(2, 32, 8, 128, device=DEV)
    lse = torch.randn(2, 32, 8, device=DEV)
    out = torch.empty(2, 32, 128, device=DEV, dtype=torch.float16)
    early = decode.reduce_partials(part, lse, out, pdl=True)
    assert carveout.carveout(early) == carveout.MAX_SHARED
    assert decode.reduce_partials(part, lse, out, pdl=True) is early  # set once per loaded kernel, kept
    assert carveout.carveout(decode.reduce_partials(part, lse, out, pdl=False)) == -1
    assert carveout.carveout(early) == carveout.MAX_SHARED  # the launch without leaves the early kernel's setting


def test_without_dependent_launch_turns_the_arch_off_for_the_block_and_back_even_on_error():
    sm90 = sim_device((9, 0), mode=TritonMode.COMPILED)
    before = TABLES["sm_90"]
    on = pdl.dependent_launch(sm90)
    with pdl.without_dependent_launch(sm90):
        assert not pdl.dependent_launch(sm90)
        assert TABLES["sm_90"] == replace(before, pdl=False)  # only the flag differs
    assert pdl.dependent_launch(sm90) == on and TABLES["sm_90"] is before
    with pytest.raises(RuntimeError), pdl.without_dependent_launch(sm90):
        raise RuntimeError("a failing timing")
    assert TABLES["sm_90"] is before
