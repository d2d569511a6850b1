"""The engine benchmark's fresh block manager between measurements (GPU-free)."""

from types import SimpleNamespace

from benchmarks.engine import reconfigure
from vlchat.llm.config import SchedulerConfig
from vlchat.llm.engine.block_manager import BlockManager


def test_reconfigure_keeps_the_engines_block_runs():
    """The benchmark measures the engine as it serves: blocks in runs as the engine sized them, not one at a time."""
    engine = SimpleNamespace(
        block_manager=BlockManager(64, 16, True, run_blocks=8),
        runner=SimpleNamespace(num_blocks=64),
        config=SimpleNamespace(cache=SimpleNamespace(block_size=16), scheduler=SchedulerConfig(max_num_seqs=4)),
    )
    reconfigure(SimpleNamespace(engine=engine), prefix=False)
    assert engine.block_manager.run_blocks == 8 and engine.scheduler.block_manager is engine.block_manager
    reconfigure(SimpleNamespace(engine=engine), num_blocks=32)
    assert engine.block_manager.run_blocks == 8 and engine.block_manager.num_blocks == 32
