"""Run a function on N gloo ranks on this machine, as the tensor-parallel workers do, and collect the results.

`run_ranks(n, fn, *args)` spawns n processes (one torch thread each), joins them into
one gloo process group and calls `fn(*args)` in each; it returns every rank's result,
or raises with the failing rank's traceback. `fn` must be a module-level function.
`decoder_outputs` is such a function: what the TP tests compare against a single process.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue as queue_mod
import tempfile
import traceback

import torch

RANK_TIMEOUT_S = 240


def _rank_main(rank: int, world_size: int, init_method: str, fn, args: tuple, results) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
        out = fn(*args)
        results.put((rank, True, pickle.dumps(out)))
    except BaseException:  # noqa: BLE001 - the parent reports it
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(world_size: int, fn, *args) -> list:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = "file://" + os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=_rank_main, args=(r, world_size, init, fn, args, results)) for r in range(world_size)]
        for p in procs:
            p.start()
        got: dict[int, object] = {}
        try:
            for _ in range(world_size):
                rank, ok, payload = results.get(timeout=RANK_TIMEOUT_S)
                if not ok:
                    raise AssertionError(f"rank {rank} of {world_size} failed:\n{payload}")
                got[rank] = pickle.loads(payload)
        except queue_mod.Empty:
            raise AssertionError(f"ranks {sorted(set(range(world_size)) - set(got))} gave no result") from None
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
    return [got[r] for r in range(world_size)]


@torch.no_grad()
def decoder_outputs(model_dirs: dict[str, str], prompt: list[int], new_tokens: int, quantization=None) -> dict:
    """Per model: (prompt logits [tokens, vocab] from one paged prefill, `new_tokens` greedy tokens decoded
    step by step over the paged cache, the logits of a mixed step: a chunked prefill beside a decode).
    `quantization` is load_model's (e.g. "fp8" to quantize at load)."""
    from tests.llm.paged import PagedCache
    from vlchat.llm.weights import load_model

    out = {}
    for name, model_dir in model_dirs.items():
        model = load_model(model_dir, dtype=torch.float32, progress=False, quantization=quantization)
        cache = PagedCache(model)
        logits = cache.step(model, [(0, prompt)])
        tokens = cache.greedy(model, 1, prompt, new_tokens)
        cache.step(model, [(2, prompt[:7])])
        mixed = cache.step(model, [(1, [tokens[-1]]), (2, prompt[7:])])
        out[name] = (logits, tokens, mixed)
    return out
