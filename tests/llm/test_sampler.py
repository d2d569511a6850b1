"""Sampler against explicit per-row references: penalties, top-k/top-p/min-p support, seeds, logprobs."""

from __future__ import annotations

import pytest
import torch

from vlchat.llm.engine.sampler import Sampler
from vlchat.llm.engine.sequence import Sequence
from vlchat.llm.inputs import MultiModalPrompt
from vlchat.llm.sampling_params import SamplingParams

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


def test_a_batch_of_greedy_and_sampled_rows_keeps_the_greedy_rows_argmax():
    logits = torch.randn(64, V)
    rows = [seq(SamplingParams(temperature=0 if i % 2 else 1.0)) for i in range(64)]
    out = sampler()(logits, rows).token_ids
    assert [out[i] for i in range(1, 64, 2)] == logits[1::2].argmax(-1).tolist()
    assert [out[i] for i in range(0, 64, 2)] != logits[0::2].argmax(-1).tolist()  # 32 draws, not all the argmax


def test_penalties_apply_to_their_rows_in_a_mixed_batch():
    """Each penalty alone, next to a row without one: the penalised row's repeated token loses, the plain row's
    does not (through the sampler's public call, which gates the penalty pass on the batch)."""
    logits = torch.zeros(2, V)
    logits[:, 5] = 1.0  # token 5 leads token 0 by 0.5 and was already generated twice
    logits[:, 0] = 0.5
    for penalty in (dict(repetition_penalty=3.0), dict(presence_penalty=1.5), dict(frequency_penalty=0.8)):
        rows = [
            seq(SamplingParams(temperature=0), output=(5, 5)),
            seq(SamplingParams(temperature=0, **penalty), output=(5, 5)),
        ]
        assert sampler()(logits.clone(), rows).token_ids[0] == 5
        assert sampler()(logits.clone(), rows).token_ids[1] != 5, penalty


def test_each_row_gets_the_number_of_logprobs_it_asked_for():
    logits = torch.randn(3, V)
    rows = [seq(SamplingParams(temperature=0, logprobs=n)) for n in (1, 4, 0)]
    out = sampler()(logits, rows)
    assert [len(entry) for entry in out.logprobs] == [1, 4, 1]  # the top n, holding the sampled token (n=0: it only)


def test_min_tokens_leaves_eos_alone_when_the_request_ignores_eos():
    logits = torch.zeros(1, V)
    logits[0, EOS] = 10.0
    out = sampler()(logits, [seq(SamplingParams(temperature=0, min_tokens=3, ignore_eos=True))])
    assert out.token_ids == [EOS]  # with ignore_eos, EOS is an ordinary token: nothing to hold back


def test_a_seeded_request_draws_new_noise_every_step():
    logits = torch.zeros(1, V)  # uniform: each step's draw is the noise alone
    s = seq(SamplingParams(seed=7, temperature=1.0))
    smp = sampler()
    draws = []
    for _ in range(12):
        draws.append(smp(logits, [s]).token_ids[0])
        s.append_token(draws[-1])  # the next step samples the next position
    assert len(set(draws)) > 3


def test_a_seeded_draw_depends_on_its_position_only():
    """A step that is retried (a failed batch rerun in parts) draws the same token for a seeded row again,
    whatever the engine's generator and the row's own generator did meanwhile."""
    logits = torch.zeros(1, V)
    s = seq(SamplingParams(seed=7, temperature=1.0))
    smp = sampler()
    first = smp(logits, [s]).token_ids[0]
    smp.generator.manual_seed(12345)
    assert [smp(logits, [s]).token_ids[0] for _ in range(3)] == [first] * 3
    s.append_token(first)
    later = [smp(logits, [s]).token_ids[0] for _ in range(2)]
    assert later[0] == later[1]


def test_logit_bias_adds_to_the_named_tokens_of_its_row_only():
    logits = torch.randn(2, V)
    p = SamplingParams(temperature=0, logit_bias={3: 100.0, 7: -2.5})
    expect = logits[0].clone()
    expect[3] += 100.0
    expect[7] -= 2.5
    got = Sampler._apply_logit_bias(logits, [seq(p), seq(SamplingParams(temperature=0))])
    torch.testing.assert_close(got[0], expect)
    torch.testing.assert_close(got[1], logits[1])
    out = sampler()(logits, [seq(p), seq(SamplingParams(temperature=0))])
    assert out.token_ids == [3, int(logits[1].argmax())]


class _AllowOnly:
    """A stand-in matcher that allows a fixed set of tokens (the bitmask filler's input)."""

    def __init__(self, allowed):
        self.allowed = set(allowed)

    def is_error(self):
        return False


def test_grammar_rows_are_masked_and_the_other_rows_keep_their_argmax(monkeypatch):
    from vlchat.llm.engine import grammar

    def fill(self, matchers, out):
        out.zero_()
        for i, m in enumerate(matchers):
            for t in m.allowed:
                out[i, t // 32] |= 1 << (t % 32)

    monkeypatch.setattr(grammar.BitmaskFiller, "fill", fill)
    logits = torch.randn(4, V)
    rows = [seq(SamplingParams(temperature=0)) for _ in range(4)]
    rows[1].grammar, rows[3].grammar = _AllowOnly({2, 9}), _AllowOnly({5})
    out = sampler()(logits, rows).token_ids
    assert out[0] == int(logits[0].argmax()) and out[2] == int(logits[2].argmax())
    assert out[1] == (2 if logits[1, 2] > logits[1, 9] else 9)
    assert out[3] == 5
    drawn = seq(SamplingParams(temperature=1.0))
    drawn.grammar = _AllowOnly({5, 6})
    assert set(sampler()(torch.zeros(64, V), [drawn] * 64).token_ids) == {5, 6}  # a drawn row stays in its grammar


def test_unpack_bitmask_reads_bit_j_of_word_w_as_token_32w_plus_j():
    from vlchat.llm.engine.grammar import unpack_bitmask

    tokens = [0, 5, 31, 32, 63, 70]
    mask = torch.zeros(1, 3, dtype=torch.int32)
    for t in tokens:
        mask[0, t // 32] |= (1 << (t % 32)) - (1 << 32 if t % 32 == 31 else 0)
    allowed = unpack_bitmask(mask, 71)
    assert allowed.shape == (1, 71)
    assert torch.nonzero(allowed[0]).flatten().tolist() == tokens
