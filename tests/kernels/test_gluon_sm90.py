"""What the Gluon kernels share (`kernels/attention/gluon_sm90.py`): the Triton versions they need, the page sizes
their loaders read, and the table configs that rely on them."""

import pytest
import torch

from vlchat.kernels.attention import gluon_sm90
from vlchat.kernels.attention.configs import TABLES


def test_gluon_needs_triton_3_6():
    assert not gluon_sm90.gluon_usable("3.5.0")
    assert (
        gluon_sm90.gluon_usable("3.6.0")
        and gluon_sm90.gluon_usable("3.8.0+git1a2b3c")
        and gluon_sm90.gluon_usable("4.0")
    )
    assert not gluon_sm90.gluon_usable("2.3.1")


def test_ws_prefill_tiles_hold_whole_pages():
    """The Gluon prefill's loader fills a tile with BLOCK_N // PAGE page boxes: every table tile must be a multiple
    of the largest page it reads."""
    for table in TABLES.values():
        for config in (*table.prefill_ws.values(), *table.prefill_ws_window.values()):
            assert config.block_n % max(gluon_sm90.TMA_PAGES) == 0, (table.arch, config)


@pytest.mark.skipif(gluon_sm90.gluon is None, reason="this Triton has no Gluon")
def test_cache_descriptors_are_built_once_per_tensor_and_box_in_the_owners_memo():
    cache = torch.zeros(8, 16, 2, 64, dtype=torch.float16)  # [blocks, page, kv_heads, head_dim]
    layout = gluon_sm90.shared_layout((64, 64), torch.float16)
    memo: dict = {}
    first = gluon_sm90.row_descriptor(cache, 16, layout, memo)
    assert gluon_sm90.row_descriptor(cache, 16, layout, memo) is first
    assert first.shape == [8 * 16, 2 * 64] and first.block_shape == [16, 64]
    other_box = gluon_sm90.row_descriptor(cache, 32, layout, memo)
    assert other_box is not first and other_box.block_shape == [32, 64]
    other = torch.zeros_like(cache)
    assert gluon_sm90.row_descriptor(other, 16, layout, memo).base is other
    assert len(memo) == 3
    assert gluon_sm90.row_descriptor(cache, 16, layout) is not first  # no memo: built on every call


@pytest.mark.skipif(gluon_sm90.gluon is None, reason="this Triton has no Gluon")
def test_decode_descriptors_keep_the_caches_and_rebuild_the_query():
    from vlchat.kernels.attention import decode_ws

    q = torch.zeros(3, 8, 64, dtype=torch.float16)
    kc, vc = torch.zeros(8, 16, 2, 64, dtype=torch.float16), torch.zeros(8, 16, 2, 64, dtype=torch.float16)
    for pack in (1, 2):
        memo: dict = {}
        q1, k1, v1 = decode_ws.descriptors(q, kc, vc, 64, pack, memo)
        q2, k2, v2 = decode_ws.descriptors(q, kc, vc, 64, pack, memo)
        assert (k2, v2) == (k1, v1) and k2 is k1 and v2 is v1 and k1 is not v1
        assert q2 is not q1  # the query changes every call
        assert len(memo) == 2
