"""FP8 KV cache scales read from checkpoints (llm/weights.py `kv_scale_name`, the model runner's fp8 caches).

The checkpoint here holds a tiny Llama whose keys and values are 1000x smaller than usual (k_proj and v_proj
divided by 1000, q_proj and o_proj multiplied by it: the 16-bit model's outputs are unchanged): with a scale of
1.0 they fall among e4m3's subnormals and lose most of their digits, with the checkpoint's k_scale/v_scale
(the largest key/value over a calibration text / 448, as llm-compressor computes them) they keep e4m3's
precision. Its config declares the scheme the way compressed-tensors writes it (that library's own classes).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.llm.tiny import load_hf_model, make_tiny_llama
from vlchat.llm import LLM, SamplingParams
from vlchat.llm.errors import WeightMismatchError
from vlchat.llm.quantization import UnsupportedQuantizationError, quant_config_from_hf
from vlchat.llm.weights import kv_scale_name

SHRINK = 1000.0
PROMPTS = ["Hello world", "The quick brown fox jumps", "Once upon a time there was", "0123456789 + - *"]
PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=5)
ENGINE = dict(dtype="float32", device="cpu", block_size=4, enable_prefix_caching=False)


def _kv_scheme(**fields) -> dict:
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig

    args = dict(num_bits=8, type="float", strategy="tensor", dynamic=False, symmetric=True) | fields
    return QuantizationConfig(config_groups={}, kv_cache_scheme=QuantizationArgs(**args)).to_dict()


def _calibrated_amax(model_dir) -> dict[str, float]:
    """The largest |k| and |v| per layer over the prompts, taken at the transformers model's k_proj/v_proj
    outputs (rotary embedding turns pairs of key dimensions, which may grow one of them by up to sqrt(2))."""
    model, amax, hooks = load_hf_model(model_dir), {}, []
    for i, layer in enumerate(model.model.layers):
        for proj in ("k_proj", "v_proj"):
            def hook(_m, _inp, out, key=f"{i}.{proj}"):
                amax[key] = max(amax.get(key, 0.0), float(out.abs().max()))
            hooks.append(getattr(layer.self_attn, proj).register_forward_hook(hook))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    with torch.no_grad():
        for p in PROMPTS:
            model(**tok(p * 4, return_tensors="pt"))
    return amax


@pytest.fixture(scope="module")
def small_kv_dir(tmp_path_factory):
    """A tiny Llama with keys/values SHRINK times smaller and the same outputs, with k_scale/v_scale per layer."""
    out = make_tiny_llama(tmp_path_factory.mktemp("kv-scales"))
    path = out / "model.safetensors"
    state = load_file(path)
    for name in list(state):
        if ".k_proj." in name or ".v_proj." in name:
            state[name] = state[name] / SHRINK
        elif ".q_proj." in name or ".o_proj." in name:
            state[name] = state[name] * SHRINK
    save_file(state, path, metadata={"format": "pt"})
    amax = _calibrated_amax(out)
    for key, value in amax.items():
        layer, proj = key.split(".")
        state[f"model.layers.{layer}.self_attn.{proj[0]}_scale"] = torch.tensor([value * 1.5 / 448],
                                                                                 dtype=torch.bfloat16)  # fmt: skip
    save_file(state, path, metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = _kv_scheme()
    (out / "config.json").write_text(json.dumps(config))
    return out


def _variant(model_dir, out, state: dict) -> None:
    """A copy of `model_dir` at `out` whose weights are `state`."""
    shutil.copytree(model_dir, out)
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})


def _first_steps(outputs, reference) -> tuple[int, float]:
    """How many of the reference's top-5 tokens of each prompt's first step (whose context is the prompt alone:
    later steps follow tokens that may differ) are among the outputs' top 5, and their mean logprob error."""
    errors = []
    for o, r in zip(outputs, reference, strict=True):
        got, want = o.outputs[0].logprobs[0], r.outputs[0].logprobs[0]
        errors += [abs(got[t] - want[t]) for t in want if t in got]
    return len(errors), sum(errors) / max(len(errors), 1)


def _generate(model_dir, **engine):
    llm = LLM(str(model_dir), **ENGINE, **engine)
    try:
        layers = getattr(llm.engine.runner, "attn_layers", [])  # a tensor-parallel engine's are in its workers
        return llm.generate(PROMPTS, PARAMS), [a.kv_scales for a in layers]
    finally:
        llm.close()


def test_checkpoint_scales_are_the_fp8_caches_and_keep_small_keys_precise(small_kv_dir, tmp_path):
    state = load_file(small_kv_dir / "model.safetensors")
    expected = [(float(state[f"model.layers.{i}.self_attn.k_scale"].float()),
                 float(state[f"model.layers.{i}.self_attn.v_scale"].float())) for i in range(2)]  # fmt: skip
    reference, scales = _generate(small_kv_dir)
    assert scales == [(None, None)] * 2  # a 16-bit cache leaves them unused
    scaled, scales = _generate(small_kv_dir, kv_cache_dtype="fp8")
    assert scales == expected and all(s < 1e-2 for pair in scales for s in pair)

    # the same weights without the scales: the fp8 cache at 1.0
    unscaled_dir = tmp_path / "unscaled"
    _variant(small_kv_dir, unscaled_dir, {k: v for k, v in state.items() if not k.endswith("_scale")})
    unscaled, scales = _generate(unscaled_dir, kv_cache_dtype="fp8")
    assert scales == [(1.0, 1.0)] * 2

    first = [o.token_ids[0] for o in reference]
    shared, error = _first_steps(scaled, reference)
    assert [o.token_ids[0] for o in scaled] == first and shared >= 16 and error < 0.1, (shared, error)
    shared, error = _first_steps(unscaled, reference)  # most keys and values rounded to a few subnormal levels
    assert sum(o.token_ids[0] != t for o, t in zip(unscaled, first, strict=True)) >= 2 and shared <= 10, (shared, error)


def test_fp8_weights_at_load_keep_the_checkpoints_kv_scales(small_kv_dir):
    outputs, scales = _generate(small_kv_dir, kv_cache_dtype="fp8", quantization="fp8")
    assert all(s < 1e-2 for pair in scales for s in pair) and len(outputs) == len(PROMPTS)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("model.layers.3.self_attn.k_scale", ("model.layers.3.self_attn", "k")),  # compressed-tensors
        ("model.layers.3.self_attn.v_proj.v_scale", ("model.layers.3.self_attn", "v")),  # ModelOpt
        ("model.layers.3.self_attn.k_proj.output_scale", ("model.layers.3.self_attn", "k")),  # AutoFP8
        ("model.layers.3.self_attn.kv_scale", ("model.layers.3.self_attn", "kv")),  # both caches
        ("model.layers.3.self_attn.q_scale", ("model.layers.3.self_attn", "q")),  # dropped at load
        ("model.layers.3.self_attn.k_proj.weight_scale", None),  # an FP8 weight's scale
        ("model.layers.3.self_attn.k_proj.input_scale", None),
        ("model.layers.3.self_attn.k_proj.v_scale", None),
        ("model.layers.3.self_attn.output_scale", None),
    ],
)
def test_kv_scale_names(name, expected):
    assert kv_scale_name(name) == expected


def test_a_kv_scheme_other_than_fp8_is_refused_by_name():
    from transformers import LlamaConfig

    config = LlamaConfig(quantization_config=_kv_scheme(num_bits=8, type="int"))
    with pytest.raises(UnsupportedQuantizationError, match="kv_cache_scheme 8-bit int .*only symmetric 8-bit float"):
        quant_config_from_hf(config)
    assert quant_config_from_hf(LlamaConfig(quantization_config=_kv_scheme())) is None  # 16-bit weights


@pytest.mark.parametrize("bad", ["zero", "misplaced"])
def test_a_bad_or_misplaced_scale_fails_naming_the_tensor(small_kv_dir, tmp_path, bad):
    out = tmp_path / bad
    state = load_file(small_kv_dir / "model.safetensors")
    name = "model.layers.1.self_attn.v_scale" if bad == "zero" else "model.layers.9.self_attn.k_scale"
    state[name] = torch.zeros(1) if bad == "zero" else torch.ones(1)
    _variant(small_kv_dir, out, state)
    with pytest.raises(WeightMismatchError, match=name.replace(".", r"\.")):
        LLM(str(out), **ENGINE, kv_cache_dtype="fp8")


def test_every_rank_takes_the_checkpoints_scales(small_kv_dir):
    """At tensor_parallel_size 2 each worker loads the scales with its half of the KV heads: one process's tokens
    (at 1.0, the first tokens of two or more prompts would differ: the test above)."""
    expected, _ = _generate(small_kv_dir, kv_cache_dtype="fp8")
    got, _ = _generate(small_kv_dir, kv_cache_dtype="fp8", tensor_parallel_size=2)
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]
