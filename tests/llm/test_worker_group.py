"""The engine's side of the worker handshake, against stand-in workers on threads (no model, no torch.distributed).

A connection with the wrong key is refused while the group keeps waiting for its workers; workers that report
different GPU models, or ranks that are not 0..N-1, stop the start with TensorParallelError.
"""

from __future__ import annotations

import socket
import threading
from multiprocessing import AuthenticationError

from vlchat.llm.config import EngineConfig
from vlchat.llm.engine.worker import connect
from vlchat.llm.engine.workers import WorkerGroup
from vlchat.llm.errors import TensorParallelError

KEY = "5eed" * 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stand_in(address, key: str, rank: int, device: str, refused: list) -> None:
    try:
        conn = connect(address, bytes.fromhex(key))
    except AuthenticationError:
        refused.append(rank)
        return
    conn.recv()  # the engine config
    conn.send(("hello", rank, "node", device))
    try:
        conn.recv()  # until the group closes the connection
    except EOFError:
        pass


def _start(tmp_path, workers: list[tuple[str, int, str]]) -> tuple[BaseException | None, list]:
    """Start a group of 2 at a free port, then the stand-ins one after another (each refused one before the next);
    (what the group raised, the ranks of the stand-ins it refused)."""
    port = _free_port()
    config = EngineConfig(str(tmp_path), tensor_parallel_size=2, tp_listen=f"127.0.0.1:{port}", tp_authkey=KEY)
    raised: list = []

    def start_group():
        try:
            WorkerGroup(config, 64, [1], object)
        except BaseException as e:  # noqa: BLE001 - the test reads it
            raised.append(e)

    group = threading.Thread(target=start_group)
    group.start()
    refused: list = []
    for key, rank, device in workers:
        worker = threading.Thread(target=_stand_in, args=(("127.0.0.1", port), key, rank, device, refused), daemon=True)
        worker.start()
        if key != KEY:
            worker.join()
    group.join(timeout=60)
    return (raised[0] if raised else None), refused


def test_ranks_on_different_gpu_models_are_refused(tmp_path):
    workers = [("0bad" * 8, 7, "NVIDIA H200"), (KEY, 0, "NVIDIA H200"), (KEY, 1, "NVIDIA H100 80GB HBM3")]
    raised, refused = _start(tmp_path, workers)
    assert refused == [7]  # a wrong key is turned away and the group goes on waiting for its workers
    assert isinstance(raised, TensorParallelError)
    assert "same GPU model; got rank 0: NVIDIA H200 on node, rank 1: NVIDIA H100 80GB HBM3 on node" in str(raised)


def test_ranks_must_be_zero_to_n_minus_one(tmp_path):
    raised, _ = _start(tmp_path, [(KEY, 0, "NVIDIA H200"), (KEY, 0, "NVIDIA H200")])
    assert isinstance(raised, TensorParallelError) and "ranks [0, 0] of 2" in str(raised)
