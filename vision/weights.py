"""Weight names of the vision models, in the engine's declarative rules (llm/weights.py).

Our vision modules keep the HF module names wherever the computation is the same,
so a tower needs rules only where we fuse (q/k/v into `qkv_proj`, gate/up into
`gate_up_proj`) or rename. Towers loaded outside a whole checkpoint apply these rules
with `llm.weights.load_tensors`, the engine's own loader.
"""

from __future__ import annotations

from vlchat.llm.layers.linear import copy_weight
from vlchat.llm.weights import ALL_SHARDS, WeightRule

# Separate q/k/v and gate/up checkpoint tensors -> pieces of our fused linears.
FUSED_RULES = [
    WeightRule(r"\.q_proj\.", ".qkv_proj.", shard="q"),
    WeightRule(r"\.k_proj\.", ".qkv_proj.", shard="k"),
    WeightRule(r"\.v_proj\.", ".qkv_proj.", shard="v"),
    WeightRule(r"\.gate_proj\.", ".gate_up_proj.", shard=0),
    WeightRule(r"\.up_proj\.", ".gate_up_proj.", shard=1),
]


def packed_rule(pattern: str, replacement: str) -> WeightRule:
    """A rule for a checkpoint tensor that already holds every piece of a fused parameter: copied whole."""
    return WeightRule(pattern, replacement, shard=ALL_SHARDS, loader=copy_weight)


def drop_layers_rule(prefix: str, first_unused: int, total: int) -> list[WeightRule]:
    """Drop `prefix.{i}.*` for the layers a model never runs (i >= first_unused)."""
    if first_unused >= total:
        return []
    unused = "|".join(str(i) for i in range(first_unused, total))
    return [WeightRule(rf"{prefix}\.(?:{unused})\.", None)]
