import os

import torch

from vlchat.kernels.device import DeviceInfo, TritonMode, get_device_info


def test_device_info_is_cached_and_consistent():
    info = get_device_info()
    assert info is get_device_info()
    assert isinstance(info, DeviceInfo)
    if torch.cuda.is_available():
        assert info.type == "cuda"
        assert info.capability == torch.cuda.get_device_capability()
        assert info.sm_count == torch.cuda.get_device_properties(0).multi_processor_count
        assert info.shared_mem_per_block > 0
        assert info.supports_bf16 == (info.capability >= (8, 0))
        assert info.arch == f"sm_{info.capability[0]}{info.capability[1]}"
    else:
        assert info.type == "cpu"
        assert info.capability is None and info.arch == "cpu"
        assert info.sm_count == (os.cpu_count() or 1)
        # conftest turns the interpreter on for CPU-only machines
        assert info.triton == TritonMode.INTERPRETED
