"""Sampler against explicit per-row references: penalties, top-k/top-p/min-p support, seeds, logprobs."""

from __future__ import annotations

import pytest
import torch

from llm.engine.sampler import Sampler
from llm.engine.sequence import Sequence
from llm.inputs import MultiModalPrompt
from llm.sampling_params import SamplingParams

V = 12
EOS = 11


def seq(params: SamplingParams, prompt=(1, 2, 3), output=(), index=0) -> Sequence:
    s = Sequence("r", MultiModalPrompt(list(prompt)), params, 4, index=index)
    for t in output:
        s.append_token(t)
    return s


def sampler(seed=0) -> Sampler:
    return Sampler([EOS], V, torch.device("cpu"), seed=seed)


def logits_row(*values) -> torch.Tensor:
    return torch.tensor([list(values)], dtype=torch.float32)


def test_greedy_is_argmax_per_row():
    logits = torch.randn(5, V)
    out = sampler()(logits, [seq(SamplingParams(temperature=0)) for _ in range(5)])
    assert out.token_ids == logits.argmax(-1).tolist()


def test_penalties_match_the_formula():
    logits = torch.randn(1, V) * 3
    p = SamplingParams(temperature=0, repetition_penalty=1.7, presence_penalty=0.5, frequency_penalty=0.3)
    s = seq(p, prompt=(1, 2), output=(2, 5, 5))
    expect = logits[0].clone()
    for t in (1, 2, 5):  # seen in prompt or output
        expect[t] = expect[t] / 1.7 if expect[t] > 0 else expect[t] * 1.7
    for t, count in ((2, 1), (5, 2)):  # output counts
        expect[t] -= 0.3 * count + 0.5
    got = sampler()._apply_penalties(logits.clone(), [s])
    torch.testing.assert_close(got[0], expect)


def test_min_tokens_masks_eos_and_stop_ids_until_reached():
    logits = torch.zeros(2, V)
    logits[:, EOS] = 10.0
    logits[:, 4] = 9.0
    logits[:, 3] = 8.0
    p = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[4])
    out = sampler()(logits, [seq(p, output=(7,)), seq(p, output=(7, 7))])
    assert out.token_ids == [3, EOS]


@pytest.mark.parametrize(
    "params, allowed",
    [
        (SamplingParams(top_k=2), {0, 1}),
        (SamplingParams(top_p=0.6), {0, 1}),  # probs 0.5, 0.3, ...: the first two reach 0.6
        (SamplingParams(min_p=0.5), {0, 1}),  # 0.3 >= 0.5 * 0.5 keeps token 1 only
        (SamplingParams(top_k=3, top_p=0.5), {0}),
    ],
    ids=["top_k", "top_p", "min_p", "top_k+top_p"],
)
def test_truncation_keeps_only_the_allowed_tokens(params, allowed):
    probs = torch.tensor([0.5, 0.3, 0.1, 0.05, 0.05] + [0.0] * (V - 5))
    logits = torch.log(probs.clamp_min(1e-12)).repeat(400, 1)
    out = sampler()(logits, [seq(params) for _ in range(400)])
    assert set(out.token_ids) == allowed


def test_sampling_follows_the_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1] + [0.0] * (V - 3))
    logits = torch.log(probs.clamp_min(1e-12)).repeat(4000, 1)
    tokens = torch.tensor(sampler()(logits, [seq(SamplingParams()) for _ in range(4000)]).token_ids)
    freq = torch.bincount(tokens, minlength=V)[:3].float() / 4000
    torch.testing.assert_close(freq, probs[:3], atol=0.03, rtol=0)


def test_temperature_sharpens():
    logits = logits_row(*([2.0, 1.0] + [0.0] * (V - 2))).repeat(2000, 1)
    cold = sampler()(logits, [seq(SamplingParams(temperature=0.2)) for _ in range(2000)]).token_ids
    assert cold.count(0) / 2000 > 0.95


def test_seeded_rows_are_reproducible_and_independent_of_the_batch():
    logits = torch.randn(1, V)
    p = SamplingParams(seed=1234, temperature=1.0)
    draws = lambda s: [sampler(seed=s)(logits, [x]).token_ids[0] for x in [seq(p)] for _ in range(20)]  # noqa: E731
    first, second = draws(0), draws(99)  # the engine seed does not matter for a seeded request
    assert first == second
    batch = torch.cat([torch.randn(3, V), logits])
    mixed = sampler()(batch, [seq(SamplingParams()) for _ in range(3)] + [seq(p)]).token_ids[3]
    assert mixed == first[0]


def test_logprobs_of_the_sampled_token_and_top_n():
    logits = torch.randn(2, V)
    p = SamplingParams(temperature=0, logprobs=3)
    out = sampler()(logits, [seq(p), seq(SamplingParams(temperature=0))])
    ref = torch.log_softmax(logits[0], -1)
    entry = out.logprobs[0]
    top = ref.topk(3)
    assert list(entry)[0] == out.token_ids[0]
    assert set(entry) == set(top.indices.tolist())
    for tid, lp in entry.items():
        assert lp == pytest.approx(ref[tid].item(), abs=1e-5)
    assert out.logprobs[1] is None
