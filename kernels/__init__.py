"""Triton kernels with torch references, dispatched per device and dtype."""

from importlib import metadata

from kernels.device import DeviceInfo, TritonMode, get_device_info

__all__ = ["DeviceInfo", "TritonMode", "get_device_info"]


def _hub_kernels_version() -> str | None:
    """The version of Hugging Face's `kernels` distribution if it is installed here, else None."""
    try:
        return metadata.version("kernels")
    except metadata.PackageNotFoundError:
        return None


def __getattr__(name: str):
    # Hugging Face's `kernels` distribution has the same import name as this package. transformers imports it
    # (`from kernels import CUDAProperties, ...`) when it is installed, gets this package instead and would fail with a
    # bare "cannot import name"; say why instead. Only an ImportError keeps its message through `from ... import`.
    hub = None if name.startswith("__") else _hub_kernels_version()
    if hub is None:
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    raise ImportError(
        f"cannot import {name!r} from vlchat's `kernels` package: Hugging Face's `kernels` {hub} is installed in this "
        "environment under the same import name, and whatever asked for it (transformers >= 5.25 requires it) gets "
        "vlchat's package instead. vlchat pins transformers < 5.25, which does not need it: run "
        "`pip uninstall kernels` and `pip install 'transformers>=5.0,<5.25'`.",
        name=name,
    )
