"""The batched sampler's logit processing on a tiny model against a plain torch loop over the transformers model:
penalties, logit_bias, min_tokens, stop_token_ids and logprobs, greedy, all requests in one batch."""

from __future__ import annotations

import pytest
import torch

from tests.llm.tiny import load_hf_model, make_tiny_llama
from vlchat.llm import LLM, SamplingParams

PROMPTS = ["The quick brown fox", "Hello world! How are you", "Paged attention stores keys"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    model_dir = make_tiny_llama(tmp_path_factory.mktemp("ref"))
    llm = LLM(str(model_dir), dtype="float32", device="cpu", num_blocks=128)
    yield llm, load_hf_model(model_dir)
    llm.close()


def reference(hf, prompt_ids: list[int], p: SamplingParams, eos: int) -> tuple[list[int], list[dict[int, float]]]:
    """Greedy decoding with every logit rule written out per token (the formulas of SamplingParams' docstring)."""
    ids, out, logprobs = list(prompt_ids), [], []
    with torch.no_grad():
        while len(out) < p.max_tokens:
            raw = hf(torch.tensor([ids])).logits[0, -1].float()
            logits = raw.clone()
            for t in set(ids):  # repetition: prompt and output
                logits[t] = logits[t] / p.repetition_penalty if logits[t] > 0 else logits[t] * p.repetition_penalty
            for t in set(out):
                logits[t] -= p.frequency_penalty * out.count(t) + p.presence_penalty
            for t, bias in p.logit_bias.items():
                logits[t] += bias
            stops = [*p.stop_token_ids, eos]
            if len(out) < p.min_tokens:
                logits[stops] = float("-inf")
            token = int(logits.argmax())
            if p.logprobs is not None:
                lp = torch.log_softmax(raw, -1)
                entry = {token: float(lp[token])}
                entry.update((int(i), float(lp[i])) for i in lp.topk(p.logprobs).indices if int(i) not in entry)
                logprobs.append(entry)
            out.append(token)  # a stop token or EOS is the last token id (its text is not in the answer)
            ids.append(token)
            if token in stops and len(out) > p.min_tokens:
                break
    return out, logprobs


def test_logit_rules_match_the_torch_reference_in_one_batch(models):
    llm, hf = models
    tok = llm.tokenizer
    eos = tok.eos_token_id
    cases = {
        "repetition": SamplingParams(temperature=0, max_tokens=12, repetition_penalty=1.8),
        "presence": SamplingParams(temperature=0, max_tokens=12, presence_penalty=1.5),
        "frequency": SamplingParams(temperature=0, max_tokens=12, frequency_penalty=1.2),
        "bias": SamplingParams(temperature=0, max_tokens=12, logit_bias={tok.encode("fox", add_special_tokens=False)[0]: 8.0,
                                                                         40: -100.0}),
        "min_tokens": SamplingParams(temperature=0, max_tokens=12, min_tokens=6, logit_bias={eos: 30.0}),
        "stop_ids": SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[50, 51, 52], logit_bias={51: 6.0}),
        "logprobs": SamplingParams(temperature=0, max_tokens=8, logprobs=4, frequency_penalty=0.5),
        "all": SamplingParams(temperature=0, max_tokens=12, repetition_penalty=1.3, presence_penalty=0.4,
                              frequency_penalty=0.6, logit_bias={33: 3.0}, logprobs=2),
    }  # fmt: skip
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(cases))]
    outs = llm.generate(prompts, list(cases.values()))
    for (name, p), prompt, out in zip(cases.items(), prompts, outs, strict=True):
        tokens, logprobs = reference(hf, tok.encode(prompt), p, eos)
        assert out.token_ids == tokens, name
        if p.logprobs is not None:
            got = out.outputs[0].logprobs
            assert [list(e) for e in got] == [list(e) for e in logprobs[: len(got)]], name
            for g, r in zip(got, logprobs, strict=False):
                assert list(g.values()) == pytest.approx(list(r.values()), abs=1e-4), name
    assert len(outs[list(cases).index("min_tokens")].token_ids) > 6  # EOS (biased up) held back for 6 tokens
    assert outs[list(cases).index("stop_ids")].finish_reason == "stop"  # the bias makes 51 come up and stop it


@pytest.mark.parametrize("field", ["logit_bias", "stop_token_ids"])
def test_token_ids_beyond_the_vocabulary_are_refused(models, field):
    from vlchat.llm.errors import InvalidRequestError

    llm, _ = models
    vocab = llm.engine.runner.sampler.vocab_size
    value = {vocab + 3: 1.0} if field == "logit_bias" else [vocab + 3]
    with pytest.raises(InvalidRequestError, match=field):
        llm.generate("Hi", SamplingParams(max_tokens=2, **{field: value}))
