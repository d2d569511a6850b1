"""Launching our compiled Triton and Gluon kernels without Triton's per-call argument binding.

`kernel[grid](*args, **kwargs)` binds every argument, specializes each (a tensor on its dtype and 16-byte
alignment, an integer on its range, on being 1 and on divisibility by 16, a TMA descriptor on its element type,
box and layout), hashes the result and looks up the compiled kernel: several times the launch itself, and an
eager engine step launches some 260 of them (benchmarks/launch.py; docs/PERF.md#engine-and-host). `launch_compiled` keeps each kernel's compiled variants under a key at least as fine as
Triton's specialization, computed here in one pass over the arguments, and launches a variant it already holds
directly; a new key goes through `kernel[grid]` once (compiling only where Triton has not) and is kept.

The key is finer than Triton's, never coarser: an integer's key holds its range class, whether it is 1 and whether
16 divides it; a tensor's its dtype and alignment; a descriptor's its element type, box, layout and alignment;
bools and None their value; floats only their type (Triton passes them as fp32, unspecialized); a constexpr its
value. A finer key costs a slow call the first time it is seen, nothing after. Arguments of any other type take
`kernel[grid]` every call. With `VLCHAT_LAUNCH_CHECK=1` (kernels/settings.py) each direct launch also runs Triton's
own binder and fails if Triton would have chosen another variant; the GPU tests run with it.

The direct path calls `CompiledKernel.run` with the arguments in the kernel's parameter order, the call
`CompiledKernel.__getitem__` makes, the same in Triton 3.6 and 3.8. It is off on other Triton versions
(DIRECT_TRITON), under the interpreter (anything but a JITFunction), for a callable grid, and while a launch hook is
installed (a profiler such as proton: its hook sees every launch through `kernel[grid]`).
"""

from __future__ import annotations

import inspect

import torch

from vlchat.kernels import settings
from vlchat.kernels.device import triton_version

# Triton versions whose launch path was read for this module (JITFunction.run's launch and
# CompiledKernel.__getitem__, the same call in both) and whose kernels ran through it: 3.6 on the H200. 3.8's
# source makes the identical call (this machine's Triton, CPU only). Other versions launch through kernel[grid].
DIRECT_TRITON = ((3, 6), (3, 8))


def direct_version(version: str) -> bool:
    """Whether a Triton of this version takes the direct path (DIRECT_TRITON, bounds included)."""
    return DIRECT_TRITON[0] <= triton_version(version) <= DIRECT_TRITON[1]


try:
    import triton
    from triton import knobs
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction
except ImportError:  # no Triton, or one without knobs (older than 3.4): kernel[grid] launches every kernel
    JITFunction = knobs = driver = None
else:
    if not direct_version(triton.__version__):
        JITFunction = None

_I32 = (-(1 << 31), (1 << 31) - 1)
_U64_MAX = (1 << 64) - 1
_SLOW = object()  # an argument this module does not key: the call takes kernel[grid]


class _Kernel:
    """What `launch_compiled` keeps per JITFunction: its parameters and compiled variants."""

    __slots__ = ("names", "constexpr", "runtime", "leading", "defaults", "variants", "device", "stream")

    def __init__(self, fn) -> None:
        params = inspect.signature(fn.fn).parameters
        self.names = tuple(params)
        self.constexpr = frozenset(p.name for p in fn.params if p.is_constexpr)
        self.runtime = frozenset(self.names) - self.constexpr
        # how many parameters come before the first constexpr: positional arguments past them are keyed by value
        self.leading = next((i for i, n in enumerate(self.names) if n in self.constexpr), len(self.names))
        self.defaults = {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}
        self.variants: dict = {}  # key -> (CompiledKernel, names after the positional ones, Triton's specialization)
        self.device = self.stream = None  # the active driver's, set at the first launch


_kernels: dict[int, _Kernel] = {}


def arg_key(value):
    """The specialization key of one runtime argument (not a constexpr), or _SLOW."""
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.data_ptr() % 16 == 0)
    kind = type(value)
    if kind is int:
        if _I32[0] <= value <= _I32[1]:
            size = 32
        elif value < 0 or value <= _U64_MAX >> 1:
            size = 64
        else:
            size = 65  # unsigned 64-bit
        return (size, value == 1, value % 16 == 0)
    if kind is bool or value is None:
        return (kind, value)
    if kind is float:
        return float
    base = getattr(value, "base", None)
    if isinstance(base, torch.Tensor) and hasattr(value, "block_shape"):  # a TMA descriptor (Triton's or Gluon's)
        return (kind, base.dtype, base.data_ptr() % 16 == 0, tuple(value.block_shape), getattr(value, "layout", None))
    return _SLOW


def _key(kernel: _Kernel, args, kwargs):
    """The call's key (runtime arguments by kind, constexprs and launch options by value), or None. The common
    kinds are keyed inline (a call per argument costs the host about as much as Triton's own binding saved)."""
    keys = [len(args)]
    append = keys.append
    if len(args) > kernel.leading:  # a constexpr given by position
        for name, value in zip(kernel.names[kernel.leading :], args[kernel.leading :], strict=False):
            if name in kernel.constexpr:
                append((name, value))
            elif (k := arg_key(value)) is _SLOW:
                return None
            else:
                append((name, k))
        args = args[: kernel.leading]
    for value in args:
        if isinstance(value, torch.Tensor):
            append((value.dtype, not value.data_ptr() & 15))
        elif type(value) is int and _I32[0] <= value <= _I32[1]:
            append(1 if value == 1 else 16 if not value & 15 else 0)
        else:
            k = arg_key(value)
            if k is _SLOW:
                return None
            append(k)
    if kernel.runtime.isdisjoint(kwargs):  # constexprs and launch options only: by value
        append(tuple(kwargs.items()))
        return tuple(keys)
    for name, value in kwargs.items():
        if name in kernel.runtime:
            value = arg_key(value)
            if value is _SLOW:
                return None
        append((name, value))
    return tuple(keys)


def enabled(fn) -> bool:
    """Whether `launch_compiled` may take its direct path for `fn`: a compiled JITFunction, no launch hook installed,
    direct launches not turned off (`VLCHAT_LAUNCH_DIRECT=0`)."""
    if JITFunction is None or not settings.launch_direct():
        return False
    return isinstance(fn, JITFunction) and not _hooked(knobs.runtime.launch_enter_hook)


def _hooked(hook) -> bool:
    """Whether a launch hook is installed: Triton 3.6+ keeps a HookChain (never None) whose `calls` are the hooks."""
    return hook is not None and bool(getattr(hook, "calls", True))


def launch_compiled(fn, grid, *args, **kwargs):
    """`fn[grid](*args, **kwargs)`, launching a compiled variant it already holds directly (module docstring).
    Returns what `fn[grid]` returns: the CompiledKernel (None under the interpreter)."""
    if not enabled(fn) or callable(grid):
        return fn[grid](*args, **kwargs)
    kernel = _kernels.get(id(fn))
    if kernel is None:
        kernel = _kernels[id(fn)] = _Kernel(fn)
        kernel.device, kernel.stream = driver.active.get_current_device, driver.active.get_current_stream
    key = _key(kernel, args, kwargs)
    if key is None:
        return fn[grid](*args, **kwargs)
    device = kernel.device()
    key = (device, key)
    try:
        variant = kernel.variants.get(key)
    except TypeError:  # an unhashable constexpr or option
        return fn[grid](*args, **kwargs)
    if variant is None:
        compiled = fn[grid](*args, **kwargs)
        if compiled is not None:
            spec = _specialization(fn, device, args, kwargs) if settings.launch_check() else None
            kernel.variants[key] = (compiled, kernel.names[len(args) :], spec)
        return compiled
    compiled, tail, spec = variant
    try:
        values = args + tuple(map(kwargs.__getitem__, tail))
    except KeyError:  # a parameter left at its default
        values = args + tuple(kwargs[n] if n in kwargs else kernel.defaults[n] for n in tail)
    if spec is not None and _specialization(fn, device, args, kwargs) != spec:
        raise RuntimeError(
            f"kernels.launch: Triton specializes this call of {fn.__name__} differently from the variant its key "
            "found; the key (kernels/launch.py arg_key) misses something this Triton specializes on"
        )
    grid = tuple(grid)
    stream = kernel.stream(device)
    compiled.run(
        grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream, compiled.function,
        compiled.packed_metadata, None, None, exit_hook if _hooked(exit_hook := knobs.runtime.launch_exit_hook) else None,
        *values,
    )  # fmt: skip
    return compiled


def _specialization(fn, device, args, kwargs):
    """Triton's own specialization of a call (its binder, as JITFunction.run calls it)."""
    binder = fn.device_caches[device][4]
    options = dict(kwargs, debug=kwargs.get("debug", fn.debug) or knobs.runtime.debug)
    if hasattr(knobs.compilation, "instrumentation_mode"):  # Triton 3.8 passes it; 3.6 has none
        options["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    _, specialization, bound_options = binder(*args, **options)
    return repr(specialization), repr(sorted(bound_options.items()))


def variants(fn) -> int:
    """How many compiled variants `launch_compiled` holds for `fn` (tests)."""
    kernel = _kernels.get(id(fn))
    return 0 if kernel is None else len(kernel.variants)
