"""What the Gluon kernels share (`kernels/attention/gluon_sm90.py`): the Triton versions they need, the page sizes
their loaders read, and the table configs that rely on them."""

from kernels.attention import gluon_sm90
from kernels.attention.configs import TABLES


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
