"""The engine end to end on a tiny random Llama (fp32, CPU) against transformers' greedy tokens.

Eight prompts of different lengths must give exactly transformers' 16 greedy
tokens: in one batch, one at a time, with prefix-cache hits, with chunked prefill
(budget smaller than the prompts) and with a KV pool so small that sequences are
preempted and recomputed. Then stop conditions, seeds, n > 1 and logprobs.
"""

from __future__ import annotations

import copy
import pickle
from dataclasses import replace

import pytest
import torch

from tests.llm.tiny import hf_greedy, load_hf_model, make_tiny_llama
from vlchat.llm import LLM, SamplingParams
from vlchat.llm.engine.request import DEFERRED_TOKENS

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
TEXTS = [
    "Hi",
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! How are you today?",
    "Paged attention stores keys and values in fixed-size blocks, block after block.",
    "0123456789 + 42",
    "A vision-language model answers questions about images. Once upon a time there was a small engine.",
    "café",
    "user: describe the picture.",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("engine"))


@pytest.fixture(scope="module")
def prompts(model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = [tok.encode(t) for t in TEXTS]
    assert len({len(p) for p in ids}) == len(ids), "the prompts should differ in length"
    return ids


@pytest.fixture(scope="module")
def reference(model_dir, prompts):
    hf = load_hf_model(model_dir)
    return [hf_greedy(hf, p, 16) for p in prompts]


@pytest.fixture(params=[False, True], ids=["sync", "async"])
def scheduling_mode(request) -> bool:
    """Every test that builds an engine runs twice: steps collected before the next is scheduled, and async scheduling
    (step N+1 launched before step N's tokens reach the host, its inputs read from the device)."""
    return request.param


@pytest.fixture
def make_llm(model_dir, scheduling_mode):
    def make(**options) -> LLM:
        options = {"block_size": 4, "num_blocks": 256, "async_scheduling": scheduling_mode, **options}
        return LLM(str(model_dir), dtype="float32", device="cpu", **options)

    return make


def tokens(outputs) -> list[list[int]]:
    return [o.token_ids for o in outputs]


def test_batch_and_one_at_a_time_equal_transformers(make_llm, prompts, reference):
    llm = make_llm(enable_prefix_caching=False)
    assert tokens(llm.generate(prompts, GREEDY)) == reference
    singles = [llm.generate([p], GREEDY)[0].token_ids for p in prompts]
    assert singles == reference


def test_prefix_cache_hits_give_the_same_tokens(make_llm, prompts, reference):
    llm = make_llm()
    first = llm.generate(prompts, GREEDY)
    second = llm.generate(prompts, GREEDY)
    assert tokens(first) == tokens(second) == reference
    assert sum(o.num_cached_tokens for o in second) > sum(o.num_cached_tokens for o in first)
    assert all(o.num_cached_tokens >= 4 * ((len(p) - 1) // 4) for o, p in zip(second, prompts, strict=True))


def test_chunked_prefill_gives_the_same_tokens(make_llm, prompts, reference):
    llm = make_llm(max_num_batched_tokens=8, max_num_seqs=8, enable_prefix_caching=False)
    assert max(len(p) for p in prompts) > 8
    assert tokens(llm.generate(prompts, GREEDY)) == reference


def test_tiny_kv_pool_preempts_and_gives_the_same_tokens(make_llm, prompts, reference):
    llm = make_llm(num_blocks=20, max_num_batched_tokens=32)
    assert tokens(llm.generate(prompts, GREEDY)) == reference
    assert llm.engine.scheduler.num_preemptions > 0
    assert llm.engine.num_free_blocks() == 20


def test_stop_conditions_and_finish_reasons(make_llm, prompts):
    llm = make_llm()
    full = llm.generate([prompts[1]], GREEDY)[0]
    text, ids = full.text, full.token_ids
    assert full.finish_reason == "length" and len(ids) == 16
    assert llm.tokenizer.decode(ids, skip_special_tokens=True).startswith(text)

    stop_id = ids[5]
    by_id = llm.generate([prompts[1]], SamplingParams(temperature=0, max_tokens=16, stop_token_ids=[stop_id]))[0]
    assert by_id.token_ids == ids[: ids.index(stop_id) + 1] and by_id.finish_reason == "stop"
    assert by_id.outputs[0].stop_reason == stop_id

    start = next(i for i in range(2, len(text) - 2) if "\ufffd" not in text[i : i + 2])
    stop = text[start : start + 2]
    by_str = llm.generate([prompts[1]], SamplingParams(temperature=0, max_tokens=16, stop=[stop]))[0]
    assert by_str.finish_reason == "stop" and by_str.text == text[: text.find(stop)]
    assert by_str.outputs[0].stop_reason == stop

    shorter = llm.generate([prompts[1]], SamplingParams(temperature=0, max_tokens=5))[0]
    assert shorter.token_ids == ids[:5] and shorter.finish_reason == "length"


def test_eos_ends_generation_unless_ignored(make_llm, prompts):
    llm = make_llm()
    eos = llm.tokenizer.eos_token_id
    # make EOS the greedy choice at once by using it as the only allowed token via a huge penalty elsewhere:
    # simpler and exact: treat the 3rd greedy token as EOS through stop_token_ids vs ignore_eos
    ids = llm.generate([prompts[2]], GREEDY)[0].token_ids
    llm.engine.eos_token_ids.append(ids[2])
    stopped = llm.generate([prompts[2]], SamplingParams(temperature=0, max_tokens=16))[0]
    ignored = llm.generate([prompts[2]], GREEDY)[0]
    assert stopped.token_ids == ids[:3] and stopped.finish_reason == "stop" and stopped.outputs[0].stop_reason is None
    assert ignored.token_ids == ids
    assert eos in llm.engine.eos_token_ids


def test_seeded_sampling_is_reproducible_and_n_completions_differ(make_llm, prompts):
    llm = make_llm()
    p = SamplingParams(temperature=1.0, top_p=0.9, seed=7, max_tokens=12, ignore_eos=True, n=3)
    a = llm.generate([prompts[3]], p)[0]
    b = llm.generate([prompts[3]], p)[0]
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert len({tuple(c.token_ids) for c in a.outputs}) > 1
    one = llm.generate([prompts[3]], SamplingParams(temperature=1.0, top_p=0.9, seed=7, max_tokens=12, ignore_eos=True))
    assert one[0].token_ids == a.outputs[0].token_ids  # completion i uses seed + i


def test_logprobs_match_transformers(make_llm, model_dir, prompts, reference):
    llm = make_llm()
    out = llm.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=2))[0]
    hf = load_hf_model(model_dir)
    ids = prompts[0] + reference[0][:3]
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0, len(prompts[0]) - 1 :], dim=-1)
    for step, entry in enumerate(out.outputs[0].logprobs):
        token = reference[0][step]
        assert list(entry)[0] == token and len(entry) == 2
        assert entry[token] == pytest.approx(ref[step, token].item(), abs=1e-4)


def test_dtype_choice_and_bf16_fallback(model_dir, caplog):
    from vlchat.llm.engine.model_runner import pick_dtype
    from vlchat.llm.weights import load_hf_config

    cfg = load_hf_config(model_dir)
    cfg.dtype = torch.bfloat16
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert pick_dtype(cfg, "auto", cpu) == torch.float32
    assert pick_dtype(cfg, "auto", cuda, supports_bf16=True) == torch.bfloat16
    with caplog.at_level("WARNING"):
        assert pick_dtype(cfg, "auto", cuda, supports_bf16=False) == torch.float16
    assert "float16" in caplog.text
    assert pick_dtype(cfg, "float16", cpu) == torch.float16


def test_repetition_penalty_matches_transformers_logits_processor(make_llm, model_dir, prompts, reference):
    from transformers import RepetitionPenaltyLogitsProcessor

    hf = load_hf_model(model_dir)
    processor = RepetitionPenaltyLogitsProcessor(1.5)
    ids = list(prompts[3])
    with torch.no_grad():
        for _ in range(10):
            scores = processor(torch.tensor([ids]), hf(torch.tensor([ids])).logits[:, -1])
            ids.append(int(scores.argmax()))
    llm = make_llm()
    out = llm.generate(
        [prompts[3]], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, repetition_penalty=1.5)
    )
    assert out[0].token_ids == ids[len(prompts[3]) :]
    assert out[0].token_ids != reference[3][:10]  # the penalty changed the greedy path


def test_n_completions_share_the_prompt_blocks(make_llm, prompts, reference, scheduling_mode):
    llm = make_llm()
    out = llm.generate([prompts[5]], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, n=3))[0]
    assert [c.token_ids for c in out.outputs] == [reference[5]] * 3 and [c.index for c in out.outputs] == [0, 1, 2]
    assert llm.engine.num_free_blocks() == 256
    engine = llm.engine
    engine.add_request("shared", prompts[5], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, n=3))
    seqs = engine.requests["shared"].seqs
    engine.step()  # launches the first completion's prompt; the others join after it
    assert [s.num_output_tokens for s in seqs] == [0, 0, 0]  # its token is still on the device
    engine.step()  # collects that token; the siblings are scheduled on the cached prompt blocks
    assert [s.num_output_tokens for s in seqs] == [1, 0, 0]
    if scheduling_mode:  # async: the second step was scheduled before the token arrived; they join the third
        engine.step()
    full_blocks = 4 * ((len(prompts[5]) - 1) // 4)
    assert [s.num_cached_prompt_tokens for s in seqs[1:]] == [full_blocks, full_blocks]
    engine.abort("shared")


def test_start_up_mixed_step_leaves_the_cache_clean_and_outputs_unchanged(make_llm, prompts, reference):
    # On CUDA the runner runs one scratch mixed step at start (Triton compiles its kernels then); here it
    # is run by hand on the CPU: it must leave no K/V behind and change no later output.
    from vlchat.kernels.attention import launch_order

    llm = make_llm()
    runner = llm.engine.runner
    steps, launch = [], runner.launch
    runner.launch = lambda seqs: steps.append([s.num_new_tokens for s in seqs]) or launch(seqs)
    runner._compile_step_kernels()
    runner.launch = launch
    assert all(not k.any() and not v.any() for k, v in runner.kv_caches)
    # a mixed step, then a prefill the kernels take in the other launch order (each order its own compiled variant)
    assert steps[0][0] == 1 and steps[0][1] > 1 and min(steps[1]) > 1
    orders = {launch_order.grid(4, len([t for t in step if t > 1]), 1)[1] for step in steps}
    assert orders == {True, False}
    assert tokens(llm.generate(prompts, GREEDY)) == reference


def test_graph_step_inputs_land_padded_in_the_static_buffers(make_llm, prompts):
    # A decode step of 3 rows replayed from the graph of bucket 4 (the graphs themselves need CUDA; their static
    # buffers and the runner's packing into them do not): the real rows as an eager step sees them, their input
    # tokens taken from the previous step's on the device, the padded row writing no K/V (slot -1) and attending to
    # no key (seq_len 0), the metadata of the 3 real rows
    from vlchat.llm.engine.cuda_graphs import DecodeGraphs

    llm = make_llm()
    engine, runner = llm.engine, llm.engine.runner
    for i in range(3):
        engine.add_request(f"r{i}", prompts[i], GREEDY)
    for _ in range(3):
        engine.step()
    seqs = engine.scheduler.schedule()  # runs ahead of the last step's tokens, still on the device
    assert [(s.num_new_tokens, s.num_computed_tokens) for s in seqs] == [(1, len(s)) for s in seqs]
    pending = [runner._sampled_tokens[runner._sampled_rows[s.seq_id]].item() for s in seqs]
    ids, pos, meta, rows = runner._prepare(seqs)
    width = runner.max_blocks + 4
    runner.graphs = DecodeGraphs([4], {}, DecodeGraphs.static_buffers(4, width, False, runner.device))
    runner.graphs.buf["longs"].fill_(7)  # stale values of an earlier step
    runner.graphs.buf["ints"].fill_(7)
    g_ids, g_pos, g_meta, g_rows = runner._prepare(seqs, bucket=4)
    s_ids, s_pos, s_slots, s_lens = DecodeGraphs.static_inputs(runner.graphs.buf, 4, False)
    assert rows is None and g_rows is None  # every row samples: no gather
    assert s_ids[:3].tolist() == ids.tolist() == pending
    assert s_pos[:3].tolist() == pos.tolist() == [len(s) for s in seqs]
    assert s_slots.tolist() == meta.slot_mapping.tolist() + [-1]
    assert s_lens.tolist() == meta.seq_lens.tolist() + [0] == [len(s) + 1 for s in seqs] + [0]
    tables = runner.graphs.buf["block_tables"][:3, : meta.block_tables.shape[1]]
    assert torch.equal(tables, meta.block_tables)
    assert g_meta.seq_lens.tolist() == meta.seq_lens.tolist() and g_meta.block_tables.shape[0] == 3
    assert g_meta.max_seqlen_k == meta.max_seqlen_k and not g_meta.is_prefill
    runner.graphs = None


def test_streamed_outputs_read_late_still_hold_their_own_step(make_llm, prompts):
    # The engine's outputs view the completion's growing text, tokens and logprobs (CompletionOutput.view): each
    # output, read after the whole generation ran (a stop string cut the text meanwhile), holds exactly what was
    # released up to its own step, the concatenation of the deltas so far
    llm = make_llm()
    full = llm.generate([prompts[1]], GREEDY)[0].text
    start = next(i for i in range(4, len(full) - 2) if "\ufffd" not in full[i : i + 2])
    stop = full[start : start + 2]
    params = SamplingParams(temperature=0, max_tokens=16, stop=[stop], logprobs=1)
    engine = llm.engine
    engine.add_request("late", prompts[1], params)
    outputs = []
    while engine.has_unfinished():
        outputs += [o.outputs[0] for o in engine.step()]
    # pickled and copied before any field is read: the fields, not the views' sources (the detokenizer, its tokenizer)
    pickled, copied = pickle.dumps(outputs[2]), copy.copy(outputs[2])
    assert len(outputs) > 3 and outputs[-1].finish_reason == "stop" and outputs[-1].text == full[: full.find(stop)]
    text, tokens = "", []
    for out in outputs:
        text, tokens = text + out.delta_text, tokens + out.delta_token_ids
        assert (out.text, out.token_ids) == (text, tokens)
        assert [next(iter(entry)) for entry in out.logprobs] == tokens  # the sampled token first
    assert outputs[-1] == outputs[-1] and outputs[0] != outputs[-1]
    assert repr(outputs[0]).startswith("CompletionOutput(index=0, text=")
    assert len(pickled) < 1000 and pickle.loads(pickled) == copied == outputs[2]


def test_unstreamed_requests_are_detokenized_in_staggered_bursts(make_llm, prompts):
    # stream=False without stop strings: the steps leave a request's text alone until its burst (the first after
    # 1..DEFERRED_TOKENS tokens by sequence id, then every DEFERRED_TOKENS), so requests added together burst on
    # different steps; the text at the end equals the streamed text. With a stop string: checked every step
    llm = make_llm()
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=2 * DEFERRED_TOKENS + 8, ignore_eos=True)
    engine.add_request("streamed", prompts[2], params)
    streamed = [o for _ in range(200) if engine.has_unfinished() for o in engine.step() if o.finished][0].outputs[0]
    names = ["quiet", "quiet2", "stops"]
    for name in names:
        engine.add_request(name, prompts[2], replace(params, stop=["\x00"] if name == "stops" else None), stream=False)
    quiet, quiet2, stops = (engine.requests[r].completions[0] for r in names)
    first = {c.burst_at: c for c in (quiet, quiet2)}
    assert len(first) == 2 and all(1 <= at <= DEFERRED_TOKENS for at in first)
    outputs, burst_steps = [], {"quiet": set(), "quiet2": set()}
    while engine.has_unfinished():
        outputs += engine.step()
        for name, c in (("quiet", quiet), ("quiet2", quiet2)):
            done, at = c.seq.num_output_tokens, 1 + c.seq.seq_id % DEFERRED_TOKENS
            if not c.seq.is_finished:
                assert len(c.queued) == (done if done < at else (done - at) % DEFERRED_TOKENS)
                if done and not c.queued:
                    burst_steps[name].add(done)
        if engine.has_unfinished() and stops.seq.num_output_tokens > 2:
            assert stops.detokenizer.num_released > 0 and len(stops.queued) == 0
    assert burst_steps["quiet"] and burst_steps["quiet2"] and not burst_steps["quiet"] & burst_steps["quiet2"]
    assert [o.request_id for o in outputs] == names and all(o.finished for o in outputs)
    for out in outputs:
        assert out.outputs[0].text == out.outputs[0].delta_text == streamed.text
        assert out.outputs[0].token_ids == streamed.token_ids


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "unstreamed"])
def test_an_aborted_request_reports_the_text_of_every_token_it_has(make_llm, prompts, stream):
    # the abort's output holds the text of the tokens collected but not yet reported (none reported, unstreamed)
    llm = make_llm()
    engine = llm.engine
    whole = llm.generate([prompts[1]], GREEDY)[0]
    engine.add_request("cut", prompts[1], GREEDY, stream=stream)
    while engine.requests["cut"].seqs[0].num_output_tokens < 6:
        engine.step()
    out = engine.abort("cut").outputs[0]
    assert out.finish_reason == "abort" and whole.token_ids[: len(out.token_ids)] == out.token_ids
    assert whole.text.startswith(out.text) and len(out.text) >= len(llm.tokenizer.decode(out.token_ids[:-1]))


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "int8", "int4"])
def test_quantized_kv_cache_tokens_do_not_depend_on_scheduling(make_llm, prompts, reference, kv_cache_dtype):
    """With a quantized cache every key is read back as stored (llm/layers/attention.py `_rows`): one batch, prefix
    cache hits, chunked prefill and preemption give the same greedy tokens. This random model's logits are too
    close to ties for whole sequences to keep transformers' tokens (tests/llm/test_kv_cache_fidelity.py measures
    that on real weights); with fp8 and int8 every first token does (int4's coarser keys move some)."""
    base = tokens(make_llm(kv_cache_dtype=kv_cache_dtype, enable_prefix_caching=False).generate(prompts, GREEDY))
    if kv_cache_dtype != "int4":
        assert [b[0] for b in base] == [r[0] for r in reference]
    llm = make_llm(kv_cache_dtype=kv_cache_dtype)
    first = llm.generate(prompts, GREEDY)
    second = llm.generate(prompts, GREEDY)
    assert tokens(first) == tokens(second) == base
    assert sum(o.num_cached_tokens for o in second) > sum(o.num_cached_tokens for o in first)
    chunked = make_llm(kv_cache_dtype=kv_cache_dtype, max_num_batched_tokens=8, max_num_seqs=8)
    assert tokens(chunked.generate(prompts, GREEDY)) == base
    small = make_llm(kv_cache_dtype=kv_cache_dtype, num_blocks=20, max_num_batched_tokens=32)
    assert tokens(small.generate(prompts, GREEDY)) == base
    assert small.engine.scheduler.num_preemptions > 0


def test_kv_cache_dtype_sizes_the_pool_by_bytes_per_token(model_dir):
    """The same cpu_cache_gb holds four times the blocks in fp8 as in this model's fp32, in int8 and int4 as many as
    their codes and float32 scale/zero pairs per token and head allow; the model runner's caches are in the chosen
    format, and int4 layers store keys less a key offset (llm/layers/attention.py set_key_offsets)."""
    from vlchat.kernels.attention import kv_quant
    from vlchat.llm.config import KV_CACHE_DTYPES

    assert KV_CACHE_DTYPES == kv_quant.KV_CACHE_DTYPES
    blocks = {}
    for name in KV_CACHE_DTYPES:
        llm = LLM(str(model_dir), dtype="float32", device="cpu", kv_cache_dtype=name, cpu_cache_gb=0.01, block_size=4)
        runner = llm.engine.runner
        blocks[name] = runner.num_blocks
        k_cache = runner.kv_caches[0][0]
        assert k_cache.dtype == kv_quant.storage_dtype(name, torch.float32)
        assert llm.engine.kv_cache_tokens == runner.num_blocks * 4
        head_dim = runner.attn_layers[0].head_dim
        assert all((a.key_offset is not None) == (name == "int4") for a in runner.attn_layers)
        llm.close()
    assert blocks["fp8"] == pytest.approx(4 * blocks["auto"], rel=0.01)
    assert blocks["int8"] == pytest.approx(blocks["auto"] * 4 * head_dim / (head_dim + 8), rel=0.01)
    assert blocks["int4"] == pytest.approx(blocks["auto"] * 4 * head_dim / (head_dim / 2 + 8), rel=0.01)
