"""Quantized decoders under tensor parallelism against the single-process quantized model, at 2 gloo ranks.

Each rank cuts its part of every quantized tensor after converting it to the kernel's layout
(llm/layers/linear.py): column-parallel layers by output columns, row-parallel ones by input rows
(4-bit codes in rows of 8, scales and zeros by whole groups; FP8 by columns, per-row scales whole).
4-bit layers give the single process's greedy tokens and logits within 1e-4. FP8 quantizes each rank's
part of a row-parallel input with its own per-token scale (no extra collective), so its logits move by
less than FP8 rounding itself moves them from the 16-bit model (1e-1 bound here, where one process's
FP8 logits lie further than that from the 16-bit ones) and its greedy tokens must match. Splits that
cannot work (groups cut by a shard, act-order) are refused with TensorParallelError.
"""

from __future__ import annotations

import pytest
import torch

from tests.llm.quant_checkpoints import write_fp8_llama, write_quantized_llama
from tests.llm.test_models import PROMPT
from tests.llm.test_quantization import _hf_llama
from tests.llm.tiny import rel_err
from tests.llm.tp_ranks import decoder_outputs, run_ranks
from vlchat.llm.errors import TensorParallelError
from vlchat.llm.layers.linear import RowParallelLinear
from vlchat.llm.parallel import TPGroup, check_shardable
from vlchat.llm.quant_fp8 import Fp8Config
from vlchat.llm.quantization import QuantConfig

NEW_TOKENS = 6
RTOL = {"w4": 1e-4, "fp8": 1e-1}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("tp-quant")
    dirs = {}
    for i, (method, group, sym) in enumerate([("gptq", 32, False), ("awq", 64, False),
                                              ("compressed-tensors", 32, True)]):  # fmt: skip
        write_quantized_llama(root / method, _hf_llama(i), method, group, sym, act_order=False)
        dirs[method] = str(root / method)
    write_fp8_llama(root / "fp8", _hf_llama(3), "fp8")
    dirs["fp8"] = str(root / "fp8")
    _hf_llama(4).save_pretrained(root / "dense")
    return dirs, str(root / "dense")


def _compare(ranks, single, tol_of):
    for rank, outputs in enumerate(ranks):
        for name, (logits, tokens, mixed) in outputs.items():
            ref_logits, ref_tokens, ref_mixed = single[name]
            where = f"{name} rank {rank}"
            assert tokens == ref_tokens, where
            assert rel_err(logits, ref_logits) < tol_of(name), where
            assert rel_err(mixed, ref_mixed) < tol_of(name), where


def test_quantized_checkpoints_match_one_process_at_tp2(checkpoints):
    dirs, _ = checkpoints
    single = decoder_outputs(dirs, PROMPT, NEW_TOKENS)
    ranks = run_ranks(2, decoder_outputs, dirs, PROMPT, NEW_TOKENS)
    _compare(ranks, single, lambda name: RTOL["fp8" if name == "fp8" else "w4"])


def test_fp8_at_load_matches_one_process_at_tp2(checkpoints):
    _, dense = checkpoints
    single = decoder_outputs({"dense": dense}, PROMPT, NEW_TOKENS, "fp8")
    ranks = run_ranks(2, decoder_outputs, {"dense": dense}, PROMPT, NEW_TOKENS, "fp8")
    _compare(ranks, single, lambda name: RTOL["fp8"])
    sixteen_bit = decoder_outputs({"dense": dense}, PROMPT, NEW_TOKENS)["dense"][0]
    assert rel_err(single["dense"][0], sixteen_bit) > RTOL["fp8"]  # the bound is below FP8's own rounding


def test_row_parallel_shards_hold_whole_groups():
    layer = RowParallelLinear(256, 8, tp=TPGroup(1, 2), quant=QuantConfig("gptq", 64, True, False))
    codes = torch.arange(256 // 8 * 8, dtype=torch.int32).reshape(32, 8)  # [K/8, N] packed rows
    scales = torch.arange(4 * 8, dtype=torch.float32).reshape(4, 8)  # [groups, N]
    layer.qweight.weight_loader(layer.qweight, codes)
    layer.scales.weight_loader(layer.scales, scales)
    assert torch.equal(layer.qweight, codes[16:]) and torch.equal(layer.scales, scales[2:])
    fp8 = RowParallelLinear(4, 2, tp=TPGroup(1, 2), quant=Fp8Config())
    fp8.weight_scale.weight_loader(fp8.weight_scale, torch.tensor([[0.5], [2.0]]))
    assert fp8.weight_scale.tolist() == [0.5, 2.0]  # per output row: whole on every rank


@pytest.mark.parametrize(
    "quant, size, message",
    [
        (QuantConfig("awq", 64, True, False), 4, "not whole groups of 64"),
        (QuantConfig("gptq", 32, True, True), 2, "act-order"),
    ],
    ids=["group-cut", "act-order"],
)
def test_splits_that_cut_groups_are_refused(quant, size, message):
    with pytest.raises(TensorParallelError, match=message):
        RowParallelLinear(128, 8, tp=TPGroup(0, size), quant=quant)


def test_the_engine_refuses_an_act_order_checkpoint_before_starting_workers():
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
    config.quantization_config = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True}
    check_shardable(config, 1)
    with pytest.raises(TensorParallelError, match="act-order"):
        check_shardable(config, 2)
