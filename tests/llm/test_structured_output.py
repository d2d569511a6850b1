"""Grammar-constrained decoding on a tiny random model: every completion that stops is a whole match of its
constraint (JSON valid against its schema, regex, choice); one cut by max_tokens is a prefix the grammar accepts.
Random schemas come from hypothesis; each example runs its schemas as one batch beside unconstrained rows, with the
engine collecting tokens before the next step (sync) and after launching it (async scheduling, where a grammar row's
sampling waits for the token in flight)."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.llm.tiny import make_tiny_llama
from vlchat.llm import LLM, SamplingParams
from vlchat.llm.errors import InvalidRequestError
from vlchat.llm.sampling_params import StructuredOutputParams

MAX_TOKENS = 400


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "async"])
def llm(request, tmp_path_factory):
    model = make_tiny_llama(tmp_path_factory.mktemp("tiny"))
    engine = LLM(str(model), device="cpu", num_blocks=512, max_model_len=512, max_num_seqs=32,
                 async_scheduling=request.param)  # fmt: skip
    yield engine
    engine.close()


_names = st.text(alphabet="abcdefgh", min_size=1, max_size=4)
_leaves = st.one_of(
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
              st.integers(-50, 50), st.integers(0, 200)),  # fmt: skip
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 5)),
    st.lists(st.text(alphabet="abc xyz", min_size=1, max_size=4), min_size=1, max_size=3, unique=True).map(
        lambda values: {"enum": values}
    ),
)


def _object(props: dict) -> st.SearchStrategy:
    required = st.lists(st.sampled_from(sorted(props)), unique=True)
    return required.map(lambda req: {"type": "object", "properties": props, "required": req,
                                     "additionalProperties": False})  # fmt: skip


def _extend(children: st.SearchStrategy) -> st.SearchStrategy:
    arrays = st.builds(lambda items, n: {"type": "array", "items": items, "maxItems": n}, children, st.integers(0, 2))
    objects = st.dictionaries(_names, children, min_size=1, max_size=3).flatmap(_object)
    return st.one_of(arrays, objects)


# additionalProperties false, maxLength, maxItems and integer ranges bound every text the schema allows, so a
# model that never chooses to end still ends within MAX_TOKENS
SCHEMAS = st.recursive(_leaves, _extend, max_leaves=5)


def _prefix_accepted(llm: LLM, spec: StructuredOutputParams, token_ids: list[int]) -> bool:
    matcher = llm.engine.grammars.matcher(spec)
    return all(matcher.consume_token(t) for t in token_ids)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schemas=st.lists(SCHEMAS, min_size=12, max_size=12), seed=st.integers(0, 2**16))
def test_random_schemas_give_valid_json(llm, schemas, seed):
    specs = [StructuredOutputParams(json_schema=s) for s in schemas]
    params = [SamplingParams(temperature=0 if i % 3 == 0 else 1.0, seed=seed + i, max_tokens=MAX_TOKENS,
                             structured_output=spec) for i, spec in enumerate(specs)]  # fmt: skip
    free = [SamplingParams(temperature=1.0, seed=seed, max_tokens=8, ignore_eos=True) for _ in range(4)]
    outs = llm.generate(["Describe the receipt as JSON."] * 16, params + free)
    stopped = 0
    for schema, spec, out in zip(schemas, specs, outs, strict=False):
        if out.finish_reason == "stop":
            jsonschema.validate(json.loads(out.text), schema)
            stopped += 1
        else:
            assert out.finish_reason == "length"
            assert _prefix_accepted(llm, spec, out.token_ids), out.text
    assert stopped >= len(schemas) // 2  # the bounds make most texts end well before MAX_TOKENS
    assert all(len(o.token_ids) == 8 for o in outs[12:])  # the unconstrained rows ran as usual


def test_json_object_regex_and_choice(llm):
    specs = {
        "object": StructuredOutputParams(json_object=True),
        "regex": StructuredOutputParams(regex=r"[0-9]{3}-[a-z]{2}"),
        "choice": StructuredOutputParams(choice=["yes", "no", "maybe so"]),
    }
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=MAX_TOKENS, structured_output=spec)
              for i, spec in enumerate(specs.values())]  # fmt: skip
    obj, regex, choice = llm.generate(["Answer:"] * 3, params)
    assert regex.finish_reason == "stop" and re.fullmatch(r"[0-9]{3}-[a-z]{2}", regex.text)
    assert choice.finish_reason == "stop" and choice.text in ("yes", "no", "maybe so")
    if obj.finish_reason == "stop":
        assert isinstance(json.loads(obj.text), dict)
    else:
        assert _prefix_accepted(llm, specs["object"], obj.token_ids)


def test_a_lark_grammar(llm):
    spec = StructuredOutputParams(grammar='start: "(" num ("," num)* ")"\nnum: /[0-9]{1,3}/')
    out = llm.generate("Numbers:", SamplingParams(temperature=1.0, seed=3, max_tokens=MAX_TOKENS,
                                                  structured_output=spec))[0]  # fmt: skip
    assert out.finish_reason == "stop" and re.fullmatch(r"\([0-9]{1,3}(,[0-9]{1,3})*\)", out.text), out.text


@pytest.mark.parametrize(
    "spec, match",
    [
        (dict(regex="[a-"), "invalid"),
        (dict(json_schema={"type": "object", "properties": {"a": {"type": "nonsense"}}}), "invalid"),
        (dict(grammar="start: undefined_rule"), "invalid"),
    ],
    ids=["regex", "schema", "grammar"],
)
def test_a_bad_constraint_is_refused_when_added(llm, spec, match):
    with pytest.raises(InvalidRequestError, match=match):
        llm.generate("x", SamplingParams(structured_output=StructuredOutputParams(**spec)))


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(), "exactly one"),
        (dict(regex="a", choice=["a"]), "exactly one"),
        (dict(choice=[]), "choice"),
        (dict(json_schema="not a dict"), "json_schema"),
    ],
    ids=["none", "two", "empty-choice", "schema-type"],
)
def test_structured_output_params_validation(fields, match):
    with pytest.raises(InvalidRequestError, match=match):
        StructuredOutputParams(**fields)


@pytest.mark.parametrize("fields", [dict(ignore_eos=True), dict(min_tokens=2)], ids=["ignore_eos", "min_tokens"])
def test_structured_output_refuses_fields_that_hide_eos(fields):
    with pytest.raises(InvalidRequestError, match=next(iter(fields))):
        SamplingParams(structured_output=StructuredOutputParams(regex="a+"), **fields)


def test_unconstrained_rows_are_unchanged_by_grammar_rows_in_their_batch(llm):
    free = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True) for _ in range(3)]
    prompts = ["The quick brown fox", "Hello world!", "Paged attention"]
    alone = [o.token_ids for o in llm.generate(prompts, free)]
    spec = StructuredOutputParams(regex="[a-z]{40}")
    mixed = llm.generate(prompts + ["x", "y"], free + [SamplingParams(temperature=0, max_tokens=60,
                                                                       structured_output=spec)] * 2)  # fmt: skip
    assert [o.token_ids for o in mixed[:3]] == alone
    assert all(re.fullmatch("[a-z]{40}", o.text) for o in mixed[3:])


async def test_async_engine_refuses_a_bad_constraint_and_frees_an_aborted_constrained_request(tmp_path_factory):
    from vlchat.llm import AsyncEngine

    model = make_tiny_llama(tmp_path_factory.mktemp("tiny-async"))
    engine = AsyncEngine.from_options(str(model), device="cpu", num_blocks=64, max_model_len=256)
    try:
        free = engine.num_free_blocks()
        bad = SamplingParams(structured_output=StructuredOutputParams(regex="[a-"))
        with pytest.raises(InvalidRequestError, match="invalid"):
            async for _ in engine.generate("bad", "x", bad):
                pass
        spec = StructuredOutputParams(regex="[a-z]+")
        outputs = engine.generate("r", "Hello", SamplingParams(max_tokens=200, temperature=1.0, structured_output=spec))
        first = await outputs.__anext__()
        assert re.fullmatch("[a-z]*", first.outputs[0].text)
        await outputs.aclose()  # leaving early aborts the request
        assert engine.num_free_blocks() == free and not engine.engine.requests
    finally:
        engine.shutdown()


def test_constrained_sequences_survive_preemption(tmp_path_factory):
    model = make_tiny_llama(tmp_path_factory.mktemp("tiny-preempt"))
    small = LLM(str(model), device="cpu", num_blocks=12, max_model_len=256, enable_prefix_caching=False)
    try:
        spec = StructuredOutputParams(regex="[a-z]{50}")
        params = [SamplingParams(temperature=1.0, seed=i, max_tokens=60, structured_output=spec) for i in range(6)]
        outs = small.generate(["Hello there"] * 6, params)
        assert small.engine.scheduler.num_preemptions > 0  # 6 x 5 blocks do not fit in 12: some were recomputed
        assert all(o.finish_reason == "stop" and re.fullmatch("[a-z]{50}", o.text) for o in outs)
    finally:
        small.close()
