"""Weight loading: every checkpoint layout gives the transformers logits; every defect a typed error.

Layouts: one safetensors file, sharded safetensors with an index, legacy
pytorch_model.bin (single and sharded with an index), a bare `*Model` checkpoint
without the "model." prefix, a tied head saved anyway. Logits are compared
with the transformers model the checkpoint came from (fp32, 1e-4 relative).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.llm.paged import PagedCache
from tests.llm.test_models import PROMPT, make_hf_model
from vlchat.llm.errors import ModelLoadError, UnsupportedModelError, WeightMismatchError
from vlchat.llm.weights import WeightRule, checkpoint_files, load_model, map_name, resolve_dtype

RTOL = 1e-4


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(checkpoint dir, its state dict, reference logits of PROMPT)."""
    model_dir, hf = make_hf_model(tmp_path_factory, "llama")
    with torch.no_grad():
        logits = hf(torch.tensor([PROMPT])).logits[0]
    return model_dir, load_file(model_dir / "model.safetensors"), logits


def _copy_config(src, dst):
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "config.json", dst / "config.json")
    return dst


def _logits(model_dir, **kwargs) -> torch.Tensor:
    model = load_model(model_dir, progress=False, **kwargs)
    return PagedCache(model).step(model, [(0, PROMPT)])


def _assert_close(got, expected):
    assert float((got - expected).abs().max() / expected.abs().max()) < RTOL


def _shards(state: dict, n: int) -> list[dict]:
    names = sorted(state)
    return [{k: state[k] for k in names[i::n]} for i in range(n)]


def _write_index(dst, index_name, files_and_states):
    weight_map = {k: f for f, part in files_and_states for k in part}
    (dst / index_name).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_sharded_safetensors_with_index(llama, tmp_path):
    src, state, expected = llama
    dst = _copy_config(src, tmp_path / "sharded")
    parts = [(f"model-{i + 1:05d}-of-00003.safetensors", part) for i, part in enumerate(_shards(state, 3))]
    for name, part in parts:
        save_file(part, dst / name)
    _write_index(dst, "model.safetensors.index.json", parts)
    assert len(checkpoint_files(dst)) == 3
    _assert_close(_logits(dst), expected)


@pytest.mark.parametrize("shards", [1, 2], ids=["single-bin", "sharded-bin"])
def test_legacy_pytorch_bin(llama, tmp_path, shards):
    src, state, expected = llama
    dst = _copy_config(src, tmp_path / "bin")
    if shards == 1:
        torch.save(state, dst / "pytorch_model.bin")
    else:
        parts = [(f"pytorch_model-{i + 1:05d}-of-00002.bin", part) for i, part in enumerate(_shards(state, 2))]
        for name, part in parts:
            torch.save(part, dst / name)
        _write_index(dst, "pytorch_model.bin.index.json", parts)
    _assert_close(_logits(dst), expected)


def test_bare_model_names_and_legacy_rotary_buffers(llama, tmp_path):
    """A checkpoint of the bare decoder (no "model." prefix) plus an old inv_freq buffer still loads."""
    src, state, expected = llama
    dst = _copy_config(src, tmp_path / "bare")
    bare = {k.removeprefix("model."): v for k, v in state.items()}
    bare["layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    save_file(bare, dst / "model.safetensors")
    _assert_close(_logits(dst), expected)


def test_tied_head_saved_anyway_is_ignored(tmp_path_factory, tmp_path):
    src, hf = make_hf_model(tmp_path_factory, "qwen2")  # tie_word_embeddings=True
    dst = _copy_config(src, tmp_path / "tied")
    state = load_file(src / "model.safetensors")
    assert "lm_head.weight" not in state
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    save_file(state, dst / "model.safetensors")
    with torch.no_grad():
        _assert_close(_logits(dst), hf(torch.tensor([PROMPT])).logits[0])


def _broken(llama, tmp_path, edit):
    src, state, _ = llama
    dst = _copy_config(src, tmp_path / "broken")
    state = dict(state)
    edit(state)
    save_file(state, dst / "model.safetensors")
    return dst


def test_missing_tensor_is_named(llama, tmp_path):
    dst = _broken(llama, tmp_path, lambda s: s.pop("model.layers.1.self_attn.k_proj.weight"))
    with pytest.raises(
        WeightMismatchError, match=r"missing.*model\.layers\.1\.self_attn\.qkv_proj\.weight \(piece 'k'\)"
    ):
        load_model(dst, progress=False)


def test_unexpected_tensor_is_named(llama, tmp_path):
    dst = _broken(llama, tmp_path, lambda s: s.update({"model.layers.0.self_attn.bogus.weight": torch.zeros(2)}))
    with pytest.raises(WeightMismatchError, match=r"unexpected.*model\.layers\.0\.self_attn\.bogus\.weight") as info:
        load_model(dst, progress=False)
    assert info.value.unexpected == ["model.layers.0.self_attn.bogus.weight"] and not info.value.missing


def test_shape_mismatch_is_named(llama, tmp_path):
    dst = _broken(llama, tmp_path, lambda s: s.update({"model.norm.weight": torch.ones(63)}))
    with pytest.raises(WeightMismatchError, match=r"shape mismatches: model\.norm\.weight.*\(63,\) vs model \(64,\)"):
        load_model(dst, progress=False)


def test_dtype_from_config_unless_overridden(llama, tmp_path):
    src, state, expected = llama
    dst = tmp_path / "half"
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["dtype"] = "bfloat16"
    (dst / "config.json").write_text(json.dumps(cfg))
    model = load_model(dst, progress=False)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    _assert_close(_logits(dst, dtype="float32"), expected)
    with pytest.raises(ValueError, match="unknown dtype 'int7'"):
        resolve_dtype(model.hf_config, "int7")


def test_directory_errors(llama, tmp_path):
    src, _, _ = llama
    with pytest.raises(ModelLoadError, match="has no config.json"):
        load_model(tmp_path, progress=False)
    empty = _copy_config(src, tmp_path / "empty")
    with pytest.raises(ModelLoadError, match="no weights in"):
        load_model(empty, progress=False)
    cfg = json.loads((src / "config.json").read_text())
    cfg["architectures"] = ["FancyNewForCausalLM"]
    (empty / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="FancyNewForCausalLM"):
        load_model(empty, progress=False)


def test_rules_chain_and_drop():
    rules = [
        WeightRule(r"^language_model\.model\.", "model."),
        WeightRule(r"\.q_proj\.", ".qkv_proj.", shard="q"),
        WeightRule(r"inv_freq$", None),
    ]
    assert map_name("language_model.model.layers.3.self_attn.q_proj.bias", rules) == (
        "model.layers.3.self_attn.qkv_proj.bias",
        "q",
        None,
    )
    assert map_name("model.rotary_emb.inv_freq", rules) is None
    assert map_name("lm_head.weight", rules) == ("lm_head.weight", None, None)


def test_random_weights_need_only_the_config(tmp_path):
    """load_format="dummy": a directory with config.json alone builds a model of random N(0, 0.02) matrices."""
    from tests.llm.tiny import tiny_llama_config

    tiny_llama_config(architectures=["LlamaForCausalLM"]).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="no weights"):
        load_model(tmp_path, progress=False)
    model = load_model(tmp_path, progress=False, random_weights=True)
    norms = [p for n, p in model.named_parameters() if "norm" in n]
    assert norms and all(bool((p == 1).all()) for p in norms)
    qkv = model.model.layers[0].self_attn.qkv_proj.weight
    assert 0.015 < float(qkv.std()) < 0.025 and abs(float(qkv.mean())) < 0.005
