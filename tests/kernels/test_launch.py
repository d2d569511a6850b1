"""kernels/launch.py: the specialization key it launches compiled variants under, and (on a GPU) direct launches
against Triton's own `kernel[grid]`, with every direct launch checked against Triton's binder (conftest sets
VLCHAT_LAUNCH_CHECK=1)."""

import pytest
import torch
import triton
import triton.language as tl

from vlchat.kernels import launch
from vlchat.kernels.device import get_device_info

CUDA = torch.cuda.is_available()


@triton.jit
def _scaled_copy_kernel(x_ptr, out_ptr, n, stride, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs * stride, mask=mask)
    tl.store(out_ptr + offs, x * scale, mask=mask)


def test_tensor_keys_dtype_and_alignment():
    x = torch.zeros(64, dtype=torch.float16)
    assert launch.arg_key(x) == (torch.float16, True)
    assert launch.arg_key(x[1:]) == (torch.float16, False)  # 2 bytes past an aligned start
    assert launch.arg_key(x[8:]) == (torch.float16, True)  # 16 bytes past
    assert launch.arg_key(x.float()) != launch.arg_key(x)


@pytest.mark.parametrize(
    "a, b, same",
    [
        (32, 48, True),  # both divisible by 16, in 32 bits
        (32, 33, False),  # divisibility
        (1, 17, False),  # 1 is specialized
        (2, 3, True),
        (16, 1 << 36, False),  # 32 against 64 bits
        (-(1 << 31), (1 << 31) - 1, False),  # divisibility (the first is a multiple of 16)
        ((1 << 63) - 16, 1 << 63, False),  # signed against unsigned 64 bits
    ],
    ids=["div16", "not-div16", "one", "plain", "i64", "i32-edges", "u64"],
)
def test_integer_keys_follow_range_one_and_divisibility(a, b, same):
    assert (launch.arg_key(a) == launch.arg_key(b)) is same


def test_other_keys():
    assert launch.arg_key(True) != launch.arg_key(False)
    assert launch.arg_key(True) != launch.arg_key(1)  # a bool is not an int to Triton
    assert launch.arg_key(None) == launch.arg_key(None)
    assert launch.arg_key(0.5) == launch.arg_key(2.0)  # floats pass as fp32, unspecialized
    assert launch.arg_key("text") is launch._SLOW
    assert launch.arg_key((1, 2)) is launch._SLOW


def test_call_key_takes_constexprs_by_value_and_runtime_arguments_by_kind():
    from triton.runtime.jit import JITFunction

    # a JITFunction of the kernel's source (under the interpreter triton.jit makes another type), never compiled
    kernel = launch._Kernel(JITFunction(getattr(_scaled_copy_kernel, "fn", _scaled_copy_kernel)))
    x = torch.zeros(64)
    key = launch._key(kernel, (x, x, 64, 1, 0.5), {"BLOCK": 32, "num_warps": 4})
    assert key == launch._key(kernel, (x, x, 48, 1, 2.0), {"BLOCK": 32, "num_warps": 4})
    assert key != launch._key(kernel, (x, x, 64, 1, 0.5), {"BLOCK": 64, "num_warps": 4})
    assert key != launch._key(kernel, (x, x, 64, 1, 0.5), {"BLOCK": 32, "num_warps": 8})
    assert key != launch._key(kernel, (x, x, 64, 2, 0.5), {"BLOCK": 32, "num_warps": 4})
    # a runtime argument given by keyword is keyed by kind, not by the tensor's identity
    by_name = launch._key(kernel, (x, x, 64, 1), {"scale": 0.5, "BLOCK": 32})
    assert by_name == launch._key(kernel, (x, x, 64, 1), {"scale": 3.0, "BLOCK": 32})
    assert launch._key(kernel, (x, "text", 64, 1, 0.5), {"BLOCK": 32}) is None
    # a constexpr given by position is keyed by value too
    assert launch._key(kernel, (x, x, 64, 1, 0.5, 32), {}) != launch._key(kernel, (x, x, 64, 1, 0.5, 64), {})
    assert launch._key(kernel, (x, x, 64, 1, 0.5, 32), {}) == launch._key(kernel, (x, x, 48, 1, 2.0, 32), {})


def _inputs(n, stride):
    device = "cuda" if CUDA else "cpu"
    return torch.randn(n * stride + 3, device=device), torch.full((n,), float("nan"), device=device)


def _run(x, out, n, stride, scale, block, via_launch):
    grid = (triton.cdiv(n, block),)
    if via_launch:
        launch.launch_compiled(_scaled_copy_kernel, grid, x, out, n, stride, scale, BLOCK=block)
    else:
        _scaled_copy_kernel[grid](x, out, n, stride, scale, BLOCK=block)
    return out.clone()


CALLS = [(64, 1, 0.5, 32), (64, 1, 2.0, 32), (48, 1, 1.5, 32), (50, 3, 1.0, 32), (1, 1, 4.0, 32), (64, 16, 0.5, 64)]


@pytest.mark.parametrize("n, stride, scale, block", CALLS)
def test_launch_matches_triton_and_the_reference(n, stride, scale, block):
    x, out = _inputs(n, stride)
    want = x[: n * stride : stride] * scale
    for _ in range(2):  # the second call of a key takes the direct path
        out.fill_(float("nan"))
        torch.testing.assert_close(_run(x, out, n, stride, scale, block, via_launch=True), want)
        out.fill_(float("nan"))
        torch.testing.assert_close(_run(x, out, n, stride, scale, block, via_launch=False), want)


@pytest.mark.skipif(
    not CUDA or not launch.direct_version(triton.__version__),
    reason="direct launches need a GPU (the interpreter takes kernel[grid]) and a Triton of DIRECT_TRITON",
)
def test_direct_launches_reuse_variants_and_pass_the_check():
    from vlchat.kernels import settings

    assert settings.launch_check(), "the GPU tests run with VLCHAT_LAUNCH_CHECK=1 (tests/conftest.py)"
    for n, stride, scale, block in CALLS * 3:
        x, out = _inputs(n, stride)
        torch.testing.assert_close(
            _run(x, out, n, stride, scale, block, via_launch=True), x[: n * stride : stride] * scale
        )
    keys = {(launch.arg_key(n), launch.arg_key(s), b) for n, s, _, b in CALLS}
    assert 1 <= launch.variants(_scaled_copy_kernel) <= len(keys)  # one per key, however often it was called


def test_direct_launches_only_on_the_triton_versions_read_for_them():
    assert launch.direct_version("3.6.0") and launch.direct_version("3.8.0") and launch.direct_version("3.7.1+git12ab")
    assert (
        not launch.direct_version("3.5.1") and not launch.direct_version("3.9.0") and not launch.direct_version("4.0")
    )


def test_interpreter_and_foreign_callables_take_kernel_grid():
    info = get_device_info()
    if info.is_cuda and launch.direct_version(triton.__version__):
        assert launch.enabled(_scaled_copy_kernel)
    else:
        assert not launch.enabled(_scaled_copy_kernel)
    assert not launch.enabled(lambda: None)


@pytest.mark.skipif(not launch.direct_version(triton.__version__), reason="this Triton launches through kernel[grid]")
def test_a_launch_hook_or_the_setting_turns_direct_launches_off():
    from triton import knobs
    from triton.runtime.jit import JITFunction

    from vlchat.kernels import settings

    fn = JITFunction(getattr(_scaled_copy_kernel, "fn", _scaled_copy_kernel))
    assert launch.enabled(fn)
    with settings.launching_directly(False):
        assert not launch.enabled(fn)
    hooks = knobs.runtime.launch_enter_hook

    def hook(*_):
        return None

    if hasattr(hooks, "add"):  # Triton 3.6+: a chain of hooks, empty by default
        hooks.add(hook)
        try:
            assert not launch.enabled(fn)
        finally:
            hooks.remove(hook)
    else:
        knobs.runtime.launch_enter_hook = hook
        try:
            assert not launch.enabled(fn)
        finally:
            knobs.runtime.launch_enter_hook = hooks
    assert launch.enabled(fn)
