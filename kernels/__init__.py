"""Triton kernels with torch references, dispatched per device and dtype."""

from vlchat.kernels.device import DeviceInfo, TritonMode, get_device_info

__all__ = ["DeviceInfo", "TritonMode", "get_device_info"]
