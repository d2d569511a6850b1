"""SamplingParams and EngineConfig validation: bad values raise InvalidRequestError naming the field."""

from __future__ import annotations

import pytest

from vlchat.llm.config import CacheConfig, EngineConfig, SchedulerConfig
from vlchat.llm.errors import InvalidRequestError
from vlchat.llm.sampling_params import SamplingParams


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(n=0), "n"),
        (dict(temperature=-0.1), "temperature"),
        (dict(top_k=-2), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(min_p=1.5), "min_p"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(presence_penalty=3.0), "presence_penalty"),
        (dict(frequency_penalty=-2.5), "frequency_penalty"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(min_tokens=5, max_tokens=3), "min_tokens"),
        (dict(logprobs=50), "logprobs"),
        (dict(stop_token_ids=[-1]), "stop_token_ids"),
        (dict(min_tokens=-1), "min_tokens"),
        # beyond what the sampler's device integers hold (2**63 used to overflow inside the batch's step)
        (dict(top_k=2**63), "top_k"),
        (dict(top_k=10**30), "top_k"),
        (dict(seed=-1), "seed"),
        (dict(seed=2**64), "seed"),
        (dict(n=10**6), "n"),
        (dict(stop_token_ids=[2**63]), "stop_token_ids"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_p=float("nan")), "top_p"),
        (dict(repetition_penalty=float("inf")), "repetition_penalty"),
        # wrong types are refused by name, not met later as a TypeError inside a step
        (dict(temperature="0.5"), "temperature"),
        (dict(top_k=5.0), "top_k"),
        (dict(n=True), "n"),
        (dict(max_tokens="16"), "max_tokens"),
        (dict(seed=1.5), "seed"),
        (dict(ignore_eos="yes"), "ignore_eos"),
        (dict(stop=[1, 2]), "stop"),
        (dict(stop_token_ids=["2"]), "stop_token_ids"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_invalid_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(InvalidRequestError, match=field):
        SamplingParams(**kwargs)


def test_the_edges_of_each_range_are_valid():
    SamplingParams(presence_penalty=2.0, frequency_penalty=-2.0, min_p=1.0, top_p=1.0, logprobs=20)
    SamplingParams(min_tokens=4, max_tokens=4, stop_token_ids=[0])


@pytest.mark.parametrize("field", ["repetition_penalty", "presence_penalty", "frequency_penalty"])
def test_each_penalty_alone_counts_as_using_penalties(field):
    assert SamplingParams(**{field: 1.5}).uses_penalties


def test_tiny_temperatures_are_greedy():
    # logits / 1e-300 overflow to inf and the draw returned garbage (an empty answer)
    assert SamplingParams(temperature=1e-300).greedy and SamplingParams(temperature=9e-6).greedy
    assert not SamplingParams(temperature=1e-4).greedy


def test_normalisation():
    p = SamplingParams(stop="END", top_k=0, temperature=0)
    assert p.stop == ["END"] and p.top_k == -1 and p.greedy and not p.uses_penalties


def test_engine_options_route_to_their_sub_config(tmp_path):
    cfg = EngineConfig.from_options(str(tmp_path), max_num_seqs=3, num_blocks=7, enforce_eager=True)
    assert cfg.scheduler.max_num_seqs == 3 and cfg.cache.num_blocks == 7 and cfg.enforce_eager
    assert cfg.tokenizer == str(tmp_path) and cfg.served_model_name == tmp_path.name
    with pytest.raises(InvalidRequestError, match="unknown engine option 'max_seqs'"):
        EngineConfig.from_options(str(tmp_path), max_seqs=3)


@pytest.mark.parametrize(
    "build, field",
    [
        (lambda p: EngineConfig(str(p / "missing")), "does not exist"),
        (lambda p: EngineConfig(str(p), dtype="fp8"), "dtype"),
        (lambda p: CacheConfig(block_size=12), "block_size"),
        (lambda p: CacheConfig(cache_fraction=1.5), "cache_fraction"),
        (lambda p: SchedulerConfig(max_num_seqs=0), "max_num_seqs"),
    ],
    ids=["model", "dtype", "block_size", "cache_fraction", "max_num_seqs"],
)
def test_invalid_config(tmp_path, build, field):
    with pytest.raises(InvalidRequestError, match=field):
        build(tmp_path)
