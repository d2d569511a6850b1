"""The attention benchmark's switch for its no-PDL column (no GPU: the arch tables only)."""

import pytest

from benchmarks.attention import without_pdl
from kernels.attention import configs
from kernels.device import TritonMode
from tests.kernels.attention_helpers import sim_device


def test_without_pdl_turns_the_arch_off_for_the_block_and_back_even_on_error():
    sm90 = sim_device((9, 0), mode=TritonMode.COMPILED)
    before = configs.TABLES["sm_90"]
    on = configs.dependent_launch(sm90)
    with without_pdl(sm90):
        assert not configs.dependent_launch(sm90)
        assert configs.TABLES["sm_90"].decode == before.decode  # only the flag differs
    assert configs.dependent_launch(sm90) == on and configs.TABLES["sm_90"] is before
    with pytest.raises(RuntimeError), without_pdl(sm90):
        raise RuntimeError("a failing timing")
    assert configs.TABLES["sm_90"] is before
