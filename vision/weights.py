"""Weight names of the vision models, in the engine's declarative rules (llm/weights.py).

Our vision modules keep the HF module names wherever the computation is the same,
so a tower needs rules only where we fuse (q/k/v into `qkv_proj`, gate/up into
`gate_up_proj`) or rename. `load_named` applies rules to an iterable of tensors with
the engine's semantics (every matching rule rewrites in turn, fused pieces through
each parameter's `weight_loader`), for towers loaded outside a whole checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from llm.errors import WeightMismatchError
from llm.layers.linear import copy_weight, default_weight_loader
from llm.weights import ALL_SHARDS, WeightRule, map_name

# Separate q/k/v and gate/up checkpoint tensors -> pieces of our fused linears.
FUSED_RULES = [
    WeightRule(r"\.q_proj\.", ".qkv_proj.", shard="q"),
    WeightRule(r"\.k_proj\.", ".qkv_proj.", shard="k"),
    WeightRule(r"\.v_proj\.", ".qkv_proj.", shard="v"),
    WeightRule(r"\.gate_proj\.", ".gate_up_proj.", shard=0),
    WeightRule(r"\.up_proj\.", ".gate_up_proj.", shard=1),
]


def whole(param: nn.Parameter, tensor: torch.Tensor) -> None:
    """Loader for a checkpoint tensor that already holds every piece of a fused parameter."""
    copy_weight(param, tensor)


def packed_rule(pattern: str, replacement: str) -> WeightRule:
    return WeightRule(pattern, replacement, shard=ALL_SHARDS, loader=whole)


def drop_layers_rule(prefix: str, first_unused: int, total: int) -> list[WeightRule]:
    """Drop `prefix.{i}.*` for the layers a model never runs (i >= first_unused)."""
    if first_unused >= total:
        return []
    unused = "|".join(str(i) for i in range(first_unused, total))
    return [WeightRule(rf"{prefix}\.(?:{unused})\.", None)]


def load_named(
    module: nn.Module, weights: Iterable[tuple[str, torch.Tensor]], rules: list[WeightRule], where: str
) -> None:
    """Fill every parameter of `module` from `weights` mapped through `rules`, or raise WeightMismatchError."""
    params = dict(module.named_parameters())
    expected = {(n, s) for n, p in params.items() for s in getattr(p, "shards", (None,))}
    loaded: set[tuple[str, object]] = set()
    unexpected, mismatched = [], []
    with torch.no_grad():
        for name, tensor in weights:
            mapped = map_name(name, rules)
            if mapped is None:
                continue
            target, shard, loader = mapped
            if target not in params:
                unexpected.append(name)
                continue
            param = params[target]
            try:
                if loader is not None:
                    loader(param, tensor)
                else:
                    getattr(param, "weight_loader", default_weight_loader)(param, tensor, shard)
            except ValueError as e:
                mismatched.append(f"{name} -> {target}: {e}")
                continue
            pieces = getattr(param, "shards", (None,)) if shard in (None, ALL_SHARDS) else (shard,)
            loaded.update((target, s) for s in pieces)
    missing = [n if s is None else f"{n} (piece {s!r})" for n, s in sorted(expected - loaded, key=str)]
    if missing or unexpected or mismatched:
        raise WeightMismatchError(missing, unexpected, mismatched, where=where)
