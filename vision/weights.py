"""Declarative weight loading for the vision towers and projectors.

A tower lists `Rule`s mapping Hugging Face parameter names (relative to the
tower) to ours; a rule may load one shard of a packed parameter (q, k, v into
one `qkv` matrix). `load_into` applies the rules and reports every missing or
unexpected tensor at once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from llm.errors import WeightMismatchError


@dataclass(frozen=True, slots=True)
class Rule:
    """`pattern` (a regex, matched in full against the HF name) -> `target` (a `re.sub` template).

    `shard`/`num_shards`: the tensor is slice `shard` of `num_shards` equal parts of the target along dim 0.
    An empty target drops the tensor on purpose (weights of layers the model never runs).
    """

    pattern: str
    target: str
    shard: int | None = None
    num_shards: int = 1
    regex: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "regex", re.compile(self.pattern))
        if self.shard is not None and not 0 <= self.shard < self.num_shards:
            raise ValueError(f"shard {self.shard} out of range for {self.num_shards} shards")


def packed_rules(pattern: str, names: tuple[str, ...], target: str) -> list[Rule]:
    """Rules loading `pattern.format(name)` for each name as consecutive shards of `target`."""
    return [Rule(pattern.format(name), target, i, len(names)) for i, name in enumerate(names)]


def load_into(module: nn.Module, weights: Iterable[tuple[str, torch.Tensor]], rules: list[Rule], where: str) -> None:
    """Copy `weights` (HF names) into `module`'s parameters and buffers through `rules`.

    Raises WeightMismatchError naming every parameter left unloaded, every tensor no rule
    maps, and every shape that does not fit.
    """
    params = dict(module.named_parameters())
    params.update(dict(module.named_buffers()))
    loaded: dict[str, int] = {}
    expected: dict[str, int] = {}
    unexpected: list[str] = []
    mismatched: list[str] = []
    for name, tensor in weights:
        target, rule = _resolve(name, rules)
        if target == "":
            continue
        if target is None or target not in params:
            unexpected.append(name)
            continue
        dest = params[target].data
        if rule.shard is not None:
            size = dest.shape[0] // rule.num_shards
            dest = dest[rule.shard * size : (rule.shard + 1) * size]
        if tuple(dest.shape) != tuple(tensor.shape):
            mismatched.append(f"{name}: checkpoint {tuple(tensor.shape)} vs model {tuple(dest.shape)}")
            continue
        dest.copy_(tensor.to(dest.dtype))
        loaded[target] = loaded.get(target, 0) + 1
        expected[target] = rule.num_shards
    missing = [n for n, _ in module.named_parameters() if loaded.get(n, 0) < expected.get(n, 1)]
    if missing or unexpected or mismatched:
        raise WeightMismatchError(missing, unexpected, mismatched, where=where)


def _resolve(name: str, rules: list[Rule]) -> tuple[str | None, Rule | None]:
    for rule in rules:
        if rule.regex.fullmatch(name):
            return rule.regex.sub(rule.target, name), rule
    return None, None
