"""CUDA graphs of prefill and mixed steps, in pieces between the attention calls.

A step that is not decode-only cannot replay one whole graph: its attention kernels take grids and arguments sized
by the step's own sequences (how many prompt tokens each brings, how long its prefix is). Everything else in a
decoder layer (norms, projections, rotary, MLP) only sees `tokens` rows, so for each token bucket the model's
forward is captured as num_layers + 1 graphs whose boundaries are the attention calls; a step pads its inputs to the
smallest bucket that holds it, replays piece 0, runs layer 0's attention eagerly on the real rows, replays piece
1, and so on. An eager prefill or mixed step launches some ten kernels a layer from Python and is host-bound at
serving sizes; in pieces, the host launches one graph and one attention a layer.

Each attention's q, k and v are copied (inside the graph before it) into buffers shared by all layers and buckets,
and its output is copied into a shared buffer that the next graph reads: a piece's outputs then need not stay
alive for the replay, so every bucket's pieces share one memory pool like the decode graphs. Padded rows (past the
step's tokens) run through the projections on stale inputs and are never attended to or read: every op outside
attention works row by row.
"""

from __future__ import annotations

import functools
import logging
import time

import torch

logger = logging.getLogger(__name__)

TOKEN_BUCKET = 32  # token buckets are multiples of this up to max_tokens


def token_buckets(max_tokens: int) -> list[int]:
    """The step sizes (tokens) captured: multiples of TOKEN_BUCKET up to max_tokens, and max_tokens itself."""
    sizes = list(range(TOKEN_BUCKET, max_tokens, TOKEN_BUCKET))
    return sizes + [max_tokens] if max_tokens > 0 else []


class _Recorder:
    """Installed as every attention layer's forward while the model is captured: copies the layer's q, k, v into
    the shared buffers, ends the piece being captured and begins the next, and hands the layer the shared output
    buffer. `capture` False: only the copies (the warm-up before a capture)."""

    def __init__(self, owner: PiecewiseGraphs, tokens: int, pool, capture: bool) -> None:
        self.owner, self.tokens, self.pool, self.capture = owner, tokens, pool, capture
        self.pieces: list[torch.cuda.CUDAGraph] = []
        self.graph: torch.cuda.CUDAGraph | None = None

    def begin(self) -> None:
        if self.capture:
            self.graph = torch.cuda.CUDAGraph()
            self.graph.capture_begin(pool=self.pool)

    def end(self) -> None:
        if self.capture:
            graph, self.graph = self.graph, None
            graph.capture_end()
            self.pieces.append(graph)
            if self.pool is None:  # the first piece's pool is every later piece's
                self.pool = graph.pool()

    def abort(self) -> None:
        """End a capture left open by an error, so that the stream can run work again."""
        if self.graph is not None:
            try:
                self.graph.capture_end()
            except Exception:  # noqa: BLE001 - the capture is invalid anyway; the caller reports the first error
                pass
            self.graph = None

    def __call__(self, layer, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        qb, kb, vb, ob = self.owner.buffers(layer, q, k, v, self.tokens)
        qb.copy_(q)
        kb.copy_(k)
        vb.copy_(v)
        self.end()
        self.begin()
        return ob


class PiecewiseGraphs:
    """Per token bucket: the pieces (graphs) of the model's forward, its static ids/positions and its output."""

    def __init__(self, attn_layers: list, max_tokens: int, uses_mrope: bool, device) -> None:
        self.attn_layers = attn_layers
        self.max_tokens = max_tokens
        self.uses_mrope = uses_mrope
        self.device = device
        self.buckets: list[int] = []
        self.inputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # bucket -> (ids, positions)
        self.pieces: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self._buffers: dict[tuple, tuple[torch.Tensor, ...]] = {}  # (q, k, v shapes per row, dtype) -> q, k, v, out
        self._layer_buffers: dict[int, tuple[torch.Tensor, ...]] = {}  # id(attention layer) -> its buffers
        self.capture_s = 0.0

    def buffers(self, layer, q, k, v, tokens: int) -> tuple[torch.Tensor, ...]:
        """The q, k, v and output buffers of `layer` (shared by the layers of the same row shapes), their first
        `tokens` rows."""
        key = (tuple(q.shape[1:]), tuple(k.shape[1:]), tuple(v.shape[1:]), q.dtype)
        if key not in self._buffers:  # made in the warm-up, before any capture
            n = self.max_tokens
            self._buffers[key] = (
                q.new_zeros((n, *q.shape[1:])), k.new_zeros((n, *k.shape[1:])), v.new_zeros((n, *v.shape[1:])),
                q.new_zeros((n, *q.shape[1:])),
            )  # fmt: skip
        self._layer_buffers[id(layer)] = self._buffers[key]
        return tuple(b[:tokens] for b in self._buffers[key])

    def fits(self, tokens: int) -> bool:
        return bool(self.buckets) and tokens <= self.buckets[-1]

    def bucket(self, tokens: int) -> int:
        return next(b for b in self.buckets if b >= tokens)

    @classmethod
    @torch.inference_mode()
    def capture(cls, model, attn_layers: list, device, max_tokens: int, uses_mrope: bool) -> PiecewiseGraphs | None:
        """Capture the pieces of every token bucket up to max_tokens; None (such steps run eagerly) if the model
        cannot be captured."""
        self = cls(attn_layers, max_tokens, uses_mrope, device)
        start = time.perf_counter()
        pool = None
        stream = torch.cuda.Stream(device)
        try:
            for tokens in reversed(token_buckets(max_tokens)):
                ids = torch.zeros(tokens, dtype=torch.long, device=device)
                pos = torch.zeros((3, tokens) if uses_mrope else (tokens,), dtype=torch.long, device=device)
                warm = _Recorder(self, tokens, pool, capture=False)
                with _recording(attn_layers, warm):
                    model(ids, pos)  # compiles and autotunes outside the capture; makes the shared buffers
                torch.cuda.synchronize(device)
                rec = _Recorder(self, tokens, pool, capture=True)
                with _recording(attn_layers, rec), torch.cuda.stream(stream):
                    try:
                        rec.begin()
                        out = model(ids, pos)
                        rec.end()
                    finally:
                        rec.abort()
                torch.cuda.synchronize(device)
                pool = rec.pool
                if len(rec.pieces) != len(attn_layers) + 1:
                    raise RuntimeError(f"{len(rec.pieces)} pieces for {len(attn_layers)} attention layers")
                self.inputs[tokens], self.pieces[tokens], self.outputs[tokens] = (ids, pos), rec.pieces, out
        except Exception as e:  # noqa: BLE001 - a model that cannot be captured still runs its steps eagerly
            logger.warning("piecewise CUDA graph capture failed (%s: %s); prefill and mixed steps run eagerly",
                           type(e).__name__, e)  # fmt: skip
            return None
        self.buckets = sorted(self.pieces)
        self.capture_s = time.perf_counter() - start
        logger.info("captured piecewise CUDA graphs of %d token buckets up to %d (%d pieces each) in %.1f s",
                    len(self.buckets), max_tokens, len(attn_layers) + 1, self.capture_s)  # fmt: skip
        return self

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The model's hidden states [tokens, hidden] for a step whose metadata is the current context: its inputs
        copied into the bucket's, the pieces replayed, each layer's attention run eagerly on the step's rows."""
        n = input_ids.shape[0]
        bucket = self.bucket(n)
        ids, pos = self.inputs[bucket]
        ids[:n].copy_(input_ids)
        pos[..., :n].copy_(positions)
        pieces = self.pieces[bucket]
        for layer, piece in zip(self.attn_layers, pieces, strict=False):
            piece.replay()
            qb, kb, vb, ob = self._layer_buffers[id(layer)]
            ob[:n].copy_(layer(qb[:n], kb[:n], vb[:n]))
        pieces[-1].replay()
        return self.outputs[bucket][:n]


class _recording:
    """Within it, every layer of `attn_layers` calls `recorder` instead of its forward."""

    def __init__(self, attn_layers: list, recorder: _Recorder) -> None:
        self.layers, self.recorder = attn_layers, recorder

    def __enter__(self):
        for layer in self.layers:
            layer.forward = functools.partial(self.recorder, layer)
        return self

    def __exit__(self, *exc) -> None:
        for layer in self.layers:
            del layer.forward
