"""A tensor-parallel worker: one process per GPU (or CPU rank) that runs every step the scheduler sends.

Started by the engine's `WorkerGroup` (llm/engine/workers.py) on this machine, or by
`torchrun` on several (docs/TENSOR_PARALLEL.md), always as

    python -m vlchat.llm.engine.worker --connect HOST:PORT

with torchrun's variables RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT and
VLCHAT_TP_AUTHKEY (hex) in the environment, read here and nowhere else. The worker
connects to the scheduler, says which rank and device it is, receives the engine
config, joins the process group (NCCL on GPUs, gloo on CPU), builds its
`ModelRunner` (its shard of the weights, its own KV pool and CUDA graphs) and then
runs each `StepMessage` as it arrives. Every rank samples the same tokens from the
same gathered logits; rank 0 sends them back. A worker that fails sends the error
and exits; a closed connection makes it exit.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection

import torch

from vlchat.llm.config import EngineConfig

REPLY_POLL_S = 0.0002  # rank 0 waits this long for the next step before checking whether the last one finished
CONNECT_WAIT_S = 600.0  # workers started before the scheduler (torchrun) retry connecting this long


@dataclass(slots=True)
class WorkerEnv:
    rank: int
    world_size: int
    local_rank: int
    authkey: bytes

    @classmethod
    def from_environ(cls) -> WorkerEnv:
        env = os.environ
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "VLCHAT_TP_AUTHKEY") if k not in env]
        if missing:
            raise SystemExit(f"vlchat worker: {', '.join(missing)} not set; start workers with torchrun or the engine")
        return cls(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)),
                   bytes.fromhex(env["VLCHAT_TP_AUTHKEY"]))  # fmt: skip


def take_device(device: str, local_rank: int) -> str:
    """Make GPU `local_rank` this process's current device where the engine runs on CUDA; its name (or "cpu")."""
    if device != "cpu" and torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.cuda.get_device_name(local_rank)
    return "cpu"


def serve(conn: Connection, env: WorkerEnv, config: EngineConfig, max_model_len: int, eos_token_ids: list[int]):
    """Everything after the hello: the process group, the runner, then the step loop until the scheduler closes."""
    import torch.distributed as dist

    from vlchat.kernels import settings as kernel_settings
    from vlchat.llm.engine.model_runner import ModelRunner
    from vlchat.llm.engine.step_message import RunnerInfo, SequenceMirror
    from vlchat.llm.weights import load_hf_config

    if config.kernel_backend is not None:
        kernel_settings.set_backend(config.kernel_backend)
    cuda = config.device != "cpu" and torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo", rank=env.rank, world_size=env.world_size)
    try:
        runner = ModelRunner(config, load_hf_config(config.model), max_model_len, eos_token_ids)
        info = RunnerInfo(runner.device.type, runner.dtype, runner.num_blocks, runner.block_nbytes,
                          runner.graphs is not None, runner.rope_tracks_length)  # fmt: skip
        conn.send(("ready", info))
        mirror = SequenceMirror(config.cache.block_size)
        pending = None  # rank 0: the last launched step, its tokens not sent yet
        while True:
            while pending is not None and not conn.poll(REPLY_POLL_S):
                if pending.done():  # no next step came first: send these tokens now
                    conn.send(("tokens", pending.result()))
                    pending = None
            message = conn.recv()
            if message is None:
                return
            launched = runner.launch(mirror.apply(message))
            if env.rank == 0:
                if pending is not None:  # the next step is queued on the device: now wait for this one
                    conn.send(("tokens", pending.result()))
                pending = launched
    finally:
        dist.destroy_process_group()


def connect(address: tuple[str, int], authkey: bytes) -> Connection:
    deadline = time.monotonic() + CONNECT_WAIT_S
    while True:
        try:
            return Client(address, authkey=authkey)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise SystemExit(f"vlchat worker: nothing listens at {address[0]}:{address[1]}") from None
            time.sleep(0.2)


def run(address: tuple[str, int], env: WorkerEnv) -> int:
    conn = connect(address, env.authkey)
    try:
        config, max_model_len, eos_token_ids = conn.recv()
        conn.send(("hello", env.rank, socket.gethostname(), take_device(config.device, env.local_rank)))
        serve(conn, env, config, max_model_len, eos_token_ids)
        return 0
    except (EOFError, ConnectionError):  # the scheduler went away: nothing to report to
        return 1
    except BaseException as exc:  # noqa: BLE001 - reported to the scheduler, which stops the engine
        detail = traceback.format_exc()
        print(f"vlchat worker rank {env.rank} failed:\n{detail}", file=sys.stderr, flush=True)
        try:
            conn.send(("error", _picklable(exc), detail))
        except Exception:  # noqa: BLE001 - the scheduler may be gone already
            pass
        return 1
    finally:
        conn.close()


def _picklable(exc: BaseException) -> BaseException | None:
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - the traceback text still goes
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vlchat.llm.engine.worker")
    parser.add_argument("--connect", required=True, metavar="HOST:PORT", help="the scheduler's worker address")
    args = parser.parse_args(argv)
    host, _, port = args.connect.rpartition(":")
    return run((host, int(port)), WorkerEnv.from_environ())


if __name__ == "__main__":
    sys.exit(main())
