"""The linear op: the Triton GEMV (interpreted on CPU) against float64, the GEMM for more rows, its tile rule,
its errors, and on an sm_90 GPU that the GEMV launched early still reads the row the kernel before it writes."""

import importlib

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from tests.kernels.attention_helpers import DEV, ON_GPU
from vlchat.kernels import dispatch
from vlchat.kernels.attention import pdl
from vlchat.kernels.device import device_for
from vlchat.kernels.ops import linear
from vlchat.kernels.ops.linear import OP, GemvConfig, gemv, gemv_config
from vlchat.llm.layers.embedding import LMHead
from vlchat.llm.layers.linear import Linear

linear_op = importlib.import_module("vlchat.kernels.ops.linear")  # the module (kernels.ops.linear is the function)
TOLS = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
SM90_GPU = ON_GPU and torch.cuda.get_device_capability()[0] >= 9


@pytest.fixture
def gemv_calls(monkeypatch) -> list:
    """The x shapes the GEMV is called with (it still runs)."""
    calls, real = [], linear_op.gemv
    monkeypatch.setattr(linear_op, "gemv", lambda *a, **kw: calls.append(a[0].shape) or real(*a, **kw))
    return calls


def _want(x, w, b=None):
    y = x.double() @ w.double().T
    return y if b is None else y + b.double()


def _assert_close(got, want, dtype):
    err = ((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
    assert err <= TOLS[dtype], err


@pytest.mark.parametrize("dtype", list(TOLS), ids=str)
@pytest.mark.parametrize("n, k", [(1, 1), (5, 70), (33, 1029), (6, 2048)], ids=lambda v: str(v))
@pytest.mark.parametrize("bias", [False, True], ids=["", "bias"])
def test_gemv_matches_float64(dtype, n, k, bias):
    """Rows past N, a K under one step, a K with a mostly-masked second step (steps of 1024), two full steps."""
    torch.manual_seed(n * k)
    x = torch.randn(1, k, device=DEV).to(dtype)
    w = torch.randn(n, k, device=DEV).to(dtype)
    b = torch.randn(n, device=DEV).to(dtype) if bias else None
    got = gemv(x, w, b)
    assert got.shape == (1, n) and got.dtype == dtype
    _assert_close(got, _want(x, w, b), dtype)


def test_gemv_writes_float32_logits_and_reads_strided_rows():
    torch.manual_seed(0)
    x = torch.randn(3, 40, device=DEV).to(torch.float16)[1:2, 4:36]  # one row of a wider tensor, offset
    w = torch.randn(10, 32, device=DEV).to(torch.float16)
    got = gemv(x, w, out_dtype=torch.float32)
    assert got.dtype == torch.float32
    _assert_close(got, _want(x, w), torch.float16)


def test_gemv_reads_a_weight_of_wider_rows_and_an_x_of_spaced_columns():
    """W a slice of a wider matrix (its row stride is not K); x a column of a wider tensor (last stride 2)."""
    torch.manual_seed(5)
    wide = torch.randn(12, 300, device=DEV)
    w = wide[:, 20:276]  # [12, 256], row stride 300
    x = torch.randn(256, 2, device=DEV)[:, 0].unsqueeze(0)  # [1, 256], last stride 2
    assert w.stride(0) == 300 and x.stride(-1) == 2
    _assert_close(gemv(x, w), _want(x, w), torch.float32)


def test_gemv_of_an_empty_k_is_the_bias():
    w = torch.empty(3, 0, device=DEV)
    b = torch.tensor([1.0, -2.0, 0.5], device=DEV)
    assert torch.equal(gemv(torch.empty(1, 0, device=DEV), w, b), b[None])
    assert torch.equal(gemv(torch.empty(1, 0, device=DEV), w), torch.zeros(1, 3, device=DEV))


def test_gemv_tile_rule():
    assert gemv_config(2048, 2048) == GemvConfig(8, 1024, 4)
    assert gemv_config(4096, 11008) == GemvConfig(8, 1024, 4)
    assert gemv_config(64, 100) == GemvConfig(8, 128, 4)  # one step covers a short K


def test_gemv_config_override_gives_the_same_sums():
    torch.manual_seed(1)
    x = torch.randn(1, 300, device=DEV)
    w = torch.randn(17, 300, device=DEV)
    for cfg in (GemvConfig(1, 64, 2), GemvConfig(8, 512, 4)):
        _assert_close(gemv(x, w, config=cfg), _want(x, w), torch.float32)


@pytest.mark.skipif(ON_GPU, reason="on a GPU an eager row takes the GEMM: the CUDA-graph test below")
def test_one_row_takes_the_gemv_and_more_rows_the_gemm(gemv_calls):
    impl = dispatch.get_impl(OP, torch.float32, device_for(torch.empty(0, device=DEV)), backend="triton")
    w = torch.randn(12, 16, device=DEV)
    b = torch.randn(12, device=DEV)
    one, many = torch.randn(1, 16, device=DEV), torch.randn(2, 16, device=DEV)  # two rows: already the GEMM
    _assert_close(impl(one, w, b), _want(one, w, b), torch.float32)
    assert torch.equal(impl(many, w, b), F.linear(many, w, b))  # the GEMM itself
    assert gemv_calls == [(1, 16)]
    assert impl(torch.randn(0, 16, device=DEV), w).shape == (0, 12)


def test_only_a_captured_row_on_an_arch_with_dependent_launch_takes_the_gemv(monkeypatch):
    """The GEMV's gains were measured on sm_90 with dependent launch; older archs keep cuBLAS (GPU-free: the
    capture state and the device are stood in for)."""
    from types import SimpleNamespace

    from tests.kernels.attention_helpers import sim_device
    from vlchat.kernels.device import TritonMode

    row = SimpleNamespace(shape=(1, 64), is_cuda=True)
    capturing = [True]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    for cap, expected in (((9, 0), True), ((10, 0), True), ((8, 0), False), ((8, 9), False), ((7, 5), False)):
        monkeypatch.setattr(linear_op, "device_for", lambda x, cap=cap: sim_device(cap, mode=TritonMode.COMPILED))
        assert linear_op.takes_gemv(row) == expected, cap
    capturing[0] = False  # eager: cuBLAS on every arch
    assert not linear_op.takes_gemv(row)
    assert not linear_op.takes_gemv(SimpleNamespace(shape=(2, 64), is_cuda=True))


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_on_a_gpu_one_row_takes_the_gemv_only_inside_a_cuda_graph(gemv_calls):
    """Eagerly the launch's host cost would outweigh what the GEMV saves on the GPU (the module says why)."""
    impl = dispatch.get_impl(OP, torch.float16, device_for(torch.empty(0, device=DEV)), backend="triton")
    x = torch.randn(1, 256, device=DEV, dtype=torch.float16)
    w = torch.randn(64, 256, device=DEV, dtype=torch.float16)
    eager = impl(x, w)
    assert gemv_calls == [] and torch.equal(eager, F.linear(x, w))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        gemv(x, w)  # compiled before the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = impl(x, w)
    graph.replay()
    torch.cuda.synchronize()
    assert gemv_calls == [(1, 256)]
    _assert_close(captured, _want(x, w), torch.float16)


def test_linear_layers_keep_their_shapes():
    torch.manual_seed(2)
    layer = Linear(16, 6, bias=True).to(DEV)
    layer.weight.data.normal_()
    layer.bias.data.normal_()
    x = torch.randn(2, 3, 16, device=DEV)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
    head = LMHead(50, 16).to(DEV)
    head.weight.data.normal_()
    logits = head(torch.randn(1, 16, device=DEV).to(torch.float16).float().to(torch.float32))
    assert logits.dtype == torch.float32 and logits.shape == (1, 50)


def test_a_layers_rows_beyond_the_gemvs_skip_the_dispatch(monkeypatch):
    """Both implementations run the GEMM there, so the layer calls it without the dispatch's host cost."""
    layer = Linear(8, 4).to(DEV)
    layer.weight.data.normal_()
    x = torch.randn(3, 8, device=DEV)

    def no_dispatch(*args, **kwargs):
        raise AssertionError("dispatched")

    monkeypatch.setattr(dispatch, "get_impl", no_dispatch)
    assert torch.equal(layer(x), F.linear(x, layer.weight))
    with pytest.raises(AssertionError, match="dispatched"):
        layer(x[:1])  # one row: the GEMV's or the GEMM's, as the dispatch decides


def test_linear_rejects_bad_input():
    w = torch.randn(4, 8)
    with pytest.raises(ValueError, match="x \\[tokens, K\\]"):
        linear(torch.randn(2, 7), w)
    with pytest.raises(ValueError, match="one dtype"):
        linear(torch.randn(2, 8, dtype=torch.float16), w)
    with pytest.raises(ValueError, match="bias must be \\[4\\]"):
        linear(torch.randn(2, 8), w, torch.randn(5))
    with pytest.raises(ValueError, match="at most 1 row"):
        gemv(torch.randn(2, 8), w)
    with pytest.raises(ValueError, match="contiguous"):
        gemv(torch.randn(1, 8), torch.randn(8, 4).T)


@triton.jit
def _late_fill_kernel(ptr, value, DELAY_NS: tl.constexpr, N: tl.constexpr):
    """Lets the next kernel launch at once, waits DELAY_NS on the GPU's clock, then fills N elements."""
    pdl.gdc_launch_dependents()
    now = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    end = now + DELAY_NS
    while now < end:
        now = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    tl.store(ptr + tl.arange(0, N), tl.full([N], value, ptr.dtype.element_ty))


@pytest.mark.skipif(not SM90_GPU, reason="programmatic dependent launch needs an sm_90 (or newer) GPU")
def test_the_gemv_launched_early_reads_the_row_written_late():
    """The GEMV loads weights before its dependent-launch wait and its input row after: here the kernel before it
    writes that row 50 ms after letting it launch, and the product must be of the new row."""
    assert pdl.dependent_launch(device_for(torch.empty(1, device=DEV)))
    w = torch.randn(4096, 2048, device=DEV, dtype=torch.float16)
    x = torch.zeros(1, 2048, device=DEV, dtype=torch.float16)
    gemv(x, w)  # compiled and loaded: the timed call below launches within microseconds of the writer
    torch.cuda.synchronize()
    _late_fill_kernel[(1,)](x, 1.0, DELAY_NS=50_000_000, N=2048, **pdl.pdl_options(True))
    y = gemv(x, w)
    torch.cuda.synchronize()
    _assert_close(y, _want(torch.ones_like(x), w), torch.float16)


@pytest.mark.skipif(not SM90_GPU, reason="programmatic dependent launch needs an sm_90 (or newer) GPU")
def test_dependent_launch_changes_no_gemv_bit():
    torch.manual_seed(3)
    x = torch.randn(1, 4096, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(5000, 4096, device=DEV, dtype=torch.bfloat16)
    dependent = gemv(x, w)
    with pdl.without_dependent_launch(device_for(x)):
        plain = gemv(x, w)
    assert torch.equal(dependent, plain)
