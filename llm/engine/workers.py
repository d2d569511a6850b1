"""The scheduler's side of tensor parallelism: N worker processes that run each step together.

`WorkerGroup` stands where a `ModelRunner` stands in the engine (same `launch`,
`num_blocks`, `graphs`...). It listens on a TCP address; workers connect to it,
either processes it starts here (`python -m vlchat.llm.engine.worker`, with the
variables torchrun would set) or processes torchrun started on other machines
(`EngineConfig.tp_listen`). Each step is one pickled `StepMessage` sent to every
worker; rank 0 answers with the sampled tokens, in step order.

Failure: while the scheduler waits it watches every worker's connection. A worker
that exits closes its connection, and one that fails sends its error first; either
way `WorkerDiedError` (or the worker's own typed error, e.g. TensorParallelError at
load) is raised, the workers started here are killed (the others may be blocked in
a collective) and every later call raises the same error at once: no hang.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import secrets
import socket
import subprocess
import sys
import tempfile
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge, wait

import torch

from vlchat.llm.config import EngineConfig
from vlchat.llm.engine.sampler import SamplerOutput
from vlchat.llm.engine.sequence import Sequence
from vlchat.llm.engine.step_message import RunnerInfo, StepEncoder
from vlchat.llm.errors import TensorParallelError, VLChatError, WorkerDiedError

logger = logging.getLogger(__name__)

ACCEPT_POLL_S = 0.5
PEER_EXIT_GRACE_S = 2.0  # how long a worker's error waits for a dead peer's connection to close (see _fail)
_CLOSED = object()  # a worker's connection closed: its process exited


def _exit_reason(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exited with code {code}"


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class RemotePending:
    """A launched step's tokens, which rank 0 sends when they are ready (the engine's PendingSample)."""

    def __init__(self, group: WorkerGroup, step: int) -> None:
        self.group, self.step = group, step

    def result(self) -> SamplerOutput:
        return self.group.tokens_of(self.step)


class WorkerGroup:
    def __init__(self, config: EngineConfig, max_model_len: int, eos_token_ids: list[int], model_cls: type) -> None:
        self.world_size = config.tensor_parallel_size
        self.model_cls = model_cls
        self.procs: list[subprocess.Popen] = []
        self.conns: list[Connection] = []
        self.error: VLChatError | None = None
        self._encoder = StepEncoder()
        self._launched = 0
        self._answered = 0
        self._replies: dict[int, SamplerOutput] = {}
        host, port = config.tp_listen.rsplit(":", 1) if config.tp_listen else ("127.0.0.1", "0")
        authkey = bytes.fromhex(config.tp_authkey) if config.tp_authkey else secrets.token_bytes(16)
        server = socket.create_server((host, int(port)))
        server.settimeout(ACCEPT_POLL_S)
        try:
            if config.tp_listen is None:
                self._spawn(server.getsockname()[1], authkey)
            else:
                logger.info("waiting for %d tensor-parallel workers at %s", self.world_size, config.tp_listen)
            start = dataclasses.replace(config, model=os.path.abspath(config.model),
                                        tokenizer=os.path.abspath(config.tokenizer))  # fmt: skip
            self._accept(server, authkey, pickle.dumps((start, max_model_len, eos_token_ids)))
            infos = [info for _, info in self._gather("ready")]
        except BaseException:
            self.close()
            raise
        finally:
            server.close()
        info: RunnerInfo = infos[0]
        self.device = torch.device(info.device_type)
        self.dtype = info.dtype
        self.num_blocks = info.num_blocks
        self.block_nbytes = info.block_nbytes
        self.graphs = info.graphs or None
        self.rope_tracks_length = info.rope_tracks_length

    # -- start --------------------------------------------------------------

    def _spawn(self, port: int, authkey: bytes) -> None:
        env = dict(os.environ)
        env.update(WORLD_SIZE=str(self.world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port("127.0.0.1")),
                   VLCHAT_TP_AUTHKEY=authkey.hex())  # fmt: skip
        env.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off (docs/TENSOR_PARALLEL.md)
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // self.world_size)))
        cmd = [sys.executable, "-m", "vlchat.llm.engine.worker", "--connect", f"127.0.0.1:{port}"]
        for rank in range(self.world_size):
            env.update(RANK=str(rank), LOCAL_RANK=str(rank))
            # started outside the source tree: its kernels/ folder must not shadow the installed package
            self.procs.append(subprocess.Popen(cmd, env=dict(env), cwd=tempfile.gettempdir()))

    def _accept(self, server: socket.socket, authkey: bytes, start: bytes) -> None:
        accepted: list[Connection] = []
        while len(accepted) < self.world_size:
            try:
                sock, _ = server.accept()
            except TimeoutError:
                for rank, proc in enumerate(self.procs):
                    if proc.poll() is not None:
                        raise WorkerDiedError(rank, _exit_reason(proc.returncode) + " before connecting") from None
                continue
            sock.settimeout(None)
            conn = Connection(sock.detach())
            try:
                deliver_challenge(conn, authkey)
                answer_challenge(conn, authkey)
                conn.send_bytes(start)
            except (AuthenticationError, EOFError, OSError) as e:  # not one of ours: keep waiting for them
                logger.warning("refused a worker connection: %s (is VLCHAT_TP_AUTHKEY the same everywhere?)", e)
                conn.close()
                continue
            accepted.append(conn)
        self.conns = accepted  # in the order they connected until their hellos say their ranks
        hellos = self._gather("hello")
        ranks = sorted(rank for _, rank, _, _ in hellos)
        if ranks != list(range(self.world_size)):
            raise TensorParallelError(f"the workers say they are ranks {ranks} of {self.world_size}; check RANK")
        self.conns = [conn for _, conn in sorted(zip([h[1] for h in hellos], accepted, strict=True))]
        devices = {rank: f"{device} on {host}" for _, rank, host, device in hellos}
        if len({device for _, _, _, device in hellos}) > 1:
            listing = ", ".join(f"rank {r}: {d}" for r, d in sorted(devices.items()))
            raise TensorParallelError(f"tensor-parallel ranks must run on the same GPU model; got {listing}")

    # -- messages -----------------------------------------------------------

    def _gather(self, kind: str) -> list:
        """One message of `kind` from every worker, in the order of self.conns."""
        got: dict[int, object] = {}
        while len(got) < len(self.conns):
            for conn in wait([c for i, c in enumerate(self.conns) if i not in got]):
                i = self.conns.index(conn)
                got[i] = self._recv(i, kind)[1:]
        return [(kind, *got[i]) for i in range(len(self.conns))]

    def _recv(self, i: int, kind: str):
        """The next message of worker i, which must be of `kind`; an error it sent, or its exit, raises."""
        try:
            message = self.conns[i].recv()
        except (EOFError, OSError):
            message = _CLOSED
        if message is _CLOSED or message[0] != kind:
            self._fail(i, message)
        return message

    def _fail(self, i: int, message) -> None:
        """Stop every worker and raise what went wrong first. A worker whose connection closed without a word
        died (its peers then fail in their collectives and report that): it is the one named."""
        reports = {r: message if r == i else self._pending_message(conn) for r, conn in enumerate(self.conns)}
        if message is not _CLOSED and _CLOSED not in reports.values():
            # a worker reported an error: if a peer's death caused it, that peer's connection closes a moment later
            quiet = [conn for r, conn in enumerate(self.conns) if reports[r] is None]
            for conn in wait(quiet, timeout=PEER_EXIT_GRACE_S):
                reports[self.conns.index(conn)] = self._pending_message(conn)
        closed = [r for r, m in reports.items() if m is _CLOSED]
        errors = [(r, m) for r, m in reports.items() if m is not _CLOSED and m is not None and m[0] == "error"]
        if closed:
            rank = closed[0]
            code = self.procs[rank].poll() if rank < len(self.procs) else None
            error = WorkerDiedError(rank, "its connection closed" if code is None else _exit_reason(code))
        elif errors:
            rank, (_, exc, detail) = errors[0]
            error = exc if isinstance(exc, VLChatError) else WorkerDiedError(rank, detail.strip().splitlines()[-1])
        else:
            error = WorkerDiedError(i, f"it sent {message[0]!r} out of turn")
        self.error = error
        self.close()
        raise error

    @staticmethod
    def _pending_message(conn: Connection):
        try:
            return conn.recv() if conn.poll() else None
        except (EOFError, OSError):
            return _CLOSED

    # -- steps --------------------------------------------------------------

    def launch(self, seqs: list[Sequence]) -> RemotePending:
        if self.error is not None:
            raise self.error
        payload = pickle.dumps(self._encoder.encode(seqs))
        for rank, conn in enumerate(self.conns):
            try:
                conn.send_bytes(payload)
            except OSError:
                self._fail(rank, _CLOSED)
        self._launched += 1
        return RemotePending(self, self._launched - 1)

    def tokens_of(self, step: int) -> SamplerOutput:
        while step not in self._replies:
            if self.error is not None:
                raise self.error
            for conn in wait(self.conns):  # only rank 0 speaks unasked: anything else is an error or an exit
                rank = self.conns.index(conn)
                message = self._recv(rank, "tokens" if rank == 0 else "error")
                if rank != 0:
                    self._fail(rank, message)
                self._replies[self._answered] = message[1]
                self._answered += 1
        return self._replies.pop(step)

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(None)  # the worker's loop ends
            except OSError:
                pass  # it is gone already
            conn.close()
        self.conns = []
        for proc in self.procs:
            try:
                proc.wait(timeout=10 if self.error is None else 0.5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs = []
