"""GGUF weights served from their quantized blocks: the decoder projections, the token embedding and the LM head.

A GGUF file (llm/gguf.py) is loaded this way when it is served by one process: the model is built with a
`GGUFConfig` (its config's `quantization_config` is {"quant_method": "gguf"}, set by `with_gguf_blocks`), and
the checkpoint iterator yields the file's Q8_0/Q5_0/Q4_K/Q5_K/Q6_K tensors of those layers as their raw blocks
(uint8 [rows, row bytes], with `ggml_type` set on the tensor). Each such tensor becomes a `GGUFMatrix`; any
other type (F16, F32, a type without a kernel here) arrives dequantized and is kept dense in the serving dtype.

- A linear layer holds one matrix per checkpoint piece (q/k/v, gate/up). Decode rows (at most GEMV_MAX_ROWS)
  where the Triton kernels run: each piece's fused kernel (kernels/ops/gguf_linear.py), the weight never
  written out. Otherwise it dequantizes the pieces (kernels/ops/gguf_dequant.py) into one [out, in] weight
  and runs the same product as a 16-bit layer, so the transient 16-bit copy is one layer's.
- The embedding gathers the blocks of the looked-up rows and dequantizes only those.
- The LM head (tied to the embedding or not): decode rows through the fused kernel with fp32 logits,
  otherwise `HEAD_CHUNK_ROWS` vocabulary rows dequantized at a time.
On a CPU the dequantization is the torch reference, equal to gguf-py's, so the served numbers are those of
the model dequantized at load. Under tensor parallelism GGUF files are still dequantized at load.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from vlchat.kernels import dispatch
from vlchat.kernels.device import device_for
from vlchat.kernels.ops import linear
from vlchat.kernels.ops.gguf_dequant import BLOCKS, dequantize_rows
from vlchat.kernels.ops.gguf_linear import GEMV_MAX_ROWS, OP, gguf_linear
from vlchat.kernels.ops.linear import GEMV_MAX_TOKENS
from vlchat.llm.errors import TensorParallelError

METHOD = "gguf"
HEAD_CHUNK_ROWS = 32768  # vocabulary rows dequantized per step of the LM head
# HF names of the tensors kept as blocks (the rest of a GGUF file is norms and biases)
KEPT_SUFFIXES = tuple(f"{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                              "down_proj", "embed_tokens", "lm_head"))  # fmt: skip


def with_gguf_blocks(hf_config):
    """A copy of a GGUF file's config whose model keeps the file's quantized blocks."""
    config = copy.deepcopy(hf_config)
    config.quantization_config = {"quant_method": METHOD}
    return config


def keeps_blocks(hf_name: str) -> bool:
    return hf_name.endswith(KEPT_SUFFIXES)


class GGUFMatrix(nn.Module):
    """One [rows, cols] matrix: the file's blocks (`qtype` a key of BLOCKS) or a dense tensor (`qtype` None)."""

    def __init__(self, data: torch.Tensor, qtype: int | None, cols: int) -> None:
        super().__init__()
        self.register_buffer("data", data)
        self.qtype = qtype
        self.rows, self.cols = data.shape[0], cols

    def dense(self, dtype: torch.dtype, start: int = 0, end: int | None = None) -> torch.Tensor:
        part = self.data[start:end]
        if self.qtype is None:
            return part.to(dtype)
        return dequantize_rows(part, self.qtype, self.cols, dtype)

    def product(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        # x: [rows, cols] -> [rows, self.rows]: the fused kernel for blocks (decode rows)
        if self.qtype is None:
            y = F.linear(x, self.data.to(x.dtype))
            return y if out_dtype is None else y.to(out_dtype)
        return gguf_linear(x, self.data, self.qtype, out_dtype)

    def gather(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        # ids: [tokens] -> [tokens, cols]
        if self.qtype is None:
            return F.embedding(ids, self.data).to(dtype)
        return dequantize_rows(self.data.index_select(0, ids), self.qtype, self.cols, dtype)


def matrix_from(loaded: torch.Tensor, cols: int, dtype: torch.dtype, device) -> GGUFMatrix:
    """A checkpoint tensor as a GGUFMatrix on `device`: blocks stay blocks, anything else is cast to `dtype`."""
    qtype = getattr(loaded, "ggml_type", None)
    if qtype in BLOCKS:
        elems, nbytes = BLOCKS[qtype]
        if loaded.dim() != 2 or loaded.shape[1] * elems != cols * nbytes:
            raise ValueError(f"shape: checkpoint blocks {tuple(loaded.shape)} do not hold {cols} columns")
        return GGUFMatrix(loaded.to(device), qtype, cols)
    if loaded.dim() != 2 or loaded.shape[1] != cols:
        raise ValueError(f"shape: checkpoint {tuple(loaded.shape)} has not {cols} columns")
    return GGUFMatrix(loaded.to(device=device, dtype=dtype), None, cols)


def _placeholder(loader) -> nn.Parameter:
    param = nn.Parameter(torch.empty(0, dtype=torch.uint8), requires_grad=False)
    param.weight_loader = loader
    return param


class GGUFConfig:
    """The quantization config of a model served from GGUF blocks (llm/layers/linear.py and embedding.py call it)."""

    embeddings = True  # the embedding and head keep blocks too

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    # --- linear layers: one GGUFMatrix per piece in `layer.gguf_pieces`, dequantized together per call
    def param_shapes(self, in_features: int, out_features: int) -> dict:
        return {"weight": ((0,), torch.uint8)}

    def buffer_shapes(self, in_features: int, out_features: int) -> dict:
        return {}

    def checkpoint_rules(self) -> list:
        return []

    def check_row_shard(self, in_per_rank: int, ranks: int) -> None:
        raise TensorParallelError("GGUF blocks are not split over ranks; GGUF files load dequantized under "
                                  "tensor parallelism")  # fmt: skip

    def load(self, layer, param: nn.Parameter, loaded: torch.Tensor, shard) -> None:
        if not hasattr(layer, "gguf_pieces"):
            layer.gguf_pieces = nn.ModuleDict()
        start, end = layer.shard_range(shard)
        matrix = matrix_from(loaded, layer.in_features, self.dtype, param.device)
        if matrix.rows != end - start:
            raise ValueError(f"shape of piece {shard!r}: checkpoint has {matrix.rows} rows, the layer {end - start}")
        layer.gguf_pieces[str(shard)] = matrix

    def finish(self, layer) -> None:
        pass

    def weight(self, layer) -> torch.Tensor:
        """The layer's [out, in] weight, dequantized from its pieces in the serving dtype."""
        pieces = [layer.gguf_pieces[str(s)].dense(self.dtype) for s in layer.shard_ids()]
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def forward(self, layer, rows: torch.Tensor) -> torch.Tensor:
        # rows: [tokens, in_features] -> [tokens, out_features]. Decode rows on a GPU: each piece's fused kernel;
        # otherwise the 16-bit layer's product on the dequantized weight (on a CPU: gguf-py's numbers exactly)
        if _fused(rows):
            y = torch.cat([layer.gguf_pieces[str(s)].product(rows) for s in layer.shard_ids()], dim=1)
            return y if layer.bias is None else y + layer.bias
        weight = self.weight(layer)
        if rows.numel() > GEMV_MAX_TOKENS * layer.in_features:
            return F.linear(rows, weight, layer.bias)
        return linear(rows, weight, layer.bias)

    # --- the embedding and the LM head: one shared GGUFMatrix in `module.gguf`
    def embedding_param(self, module) -> nn.Parameter:
        def load(param, loaded, shard=None) -> None:
            module.gguf = matrix_from(loaded, module.hidden_size, self.dtype, param.device)

        return _placeholder(load)

    def lookup(self, module, input_ids: torch.Tensor) -> torch.Tensor:
        return module.gguf.gather(input_ids, self.dtype)

    def head_logits(self, module, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [rows, hidden] -> [rows, vocab] fp32: decode rows on a GPU in one fused launch, otherwise
        # HEAD_CHUNK_ROWS vocabulary rows dequantized at a time
        matrix = module.gguf
        if _fused(hidden):
            return matrix.product(hidden, torch.float32)
        logits = torch.empty((hidden.shape[0], matrix.rows), dtype=torch.float32, device=hidden.device)
        for start in range(0, matrix.rows, HEAD_CHUNK_ROWS):
            end = min(start + HEAD_CHUNK_ROWS, matrix.rows)
            logits[:, start:end] = linear(hidden, matrix.dense(self.dtype, start, end), out_dtype=torch.float32)
        return logits


def _fused(rows: torch.Tensor) -> bool:
    return rows.shape[0] <= GEMV_MAX_ROWS and dispatch.choose(OP, rows.dtype, device_for(rows)) == "triton"


def weight_bytes(model: nn.Module) -> int:
    """Bytes of a model's parameters and GGUF matrices (each stored tensor once), without rotary tables."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    blocks = sum(b.numel() * b.element_size() for n, b in model.named_buffers() if n.endswith("gguf.data")
                 or ".gguf_pieces." in n)  # fmt: skip
    return params + blocks
