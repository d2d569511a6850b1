"""How decode steps map onto captured CUDA graphs (GPU-free: the bucketing and the per-plan merging; the graphs
themselves run in test_engine_cuda.py)."""

from vlchat.llm.engine.cuda_graphs import DecodeGraphs, batch_buckets, context_bucket, context_buckets


def test_batch_buckets_cover_every_batch_up_to_the_largest():
    assert batch_buckets(40) == [1, 2, 4, 8, 16, 32, 40]
    assert batch_buckets(1) == [1]


def test_context_buckets_double_from_512_to_max_model_len():
    assert context_buckets(4096) == [512, 1024, 2048, 4096]
    assert context_buckets(5000) == [512, 1024, 2048, 4096, 5000]
    assert context_buckets(300) == [300]
    assert context_buckets(512) == [512]


def test_a_step_takes_the_smallest_context_bucket_that_holds_its_longest_sequence():
    buckets = context_buckets(5000)
    assert [context_bucket(buckets, n) for n in (1, 512, 513, 2048, 4097, 5000)] == [512, 512, 1024, 2048, 5000, 5000]


def test_context_buckets_planned_alike_share_one_graph():
    """A batch bucket captures one graph per run of context buckets with the same plan, each serving up to the
    largest bucket of its run; a plan that comes back after another is a graph of its own."""
    plans = {512: (1, "packed"), 1024: (1, "packed"), 2048: (1, "plain"), 4096: (8, "plain"), 8192: (8, "plain")}
    merged = DecodeGraphs._plans(64, lambda bs, ctx: plans[ctx], list(plans))
    assert merged == [(1024, (1, "packed")), (2048, (1, "plain")), (8192, (8, "plain"))]
    assert DecodeGraphs._plans(1, lambda bs, ctx: (4, "same"), [512, 1024]) == [(1024, (4, "same"))]
    alternating = {512: "a", 1024: "b", 2048: "a"}
    assert [p for _, p in DecodeGraphs._plans(1, lambda bs, ctx: alternating[ctx], list(alternating))] == [
        "a",
        "b",
        "a",
    ]


def test_replay_picks_the_graph_of_the_steps_context_bucket():
    graphs = DecodeGraphs([8], {8: [(1024, "short", "out short"), (8192, "long", "out long")]}, {})
    assert graphs.graph_for(8, 700) == ("short", "out short")
    assert graphs.graph_for(8, 1024) == ("short", "out short")
    assert graphs.graph_for(8, 1025) == ("long", "out long")
    assert graphs.graph_for(8, 9000) == ("long", "out long")  # longer than any bucket: the last


def test_graph_count_is_over_every_batch_bucket_and_plan():
    held = {1: [(512, "g", "o")], 8: [(1024, "short", "out short"), (8192, "long", "out long")]}
    assert DecodeGraphs([1, 8], held, {}, capture_s=1.5).count == 3


def test_token_buckets_of_piecewise_graphs_are_multiples_of_32_and_the_largest():
    from vlchat.llm.engine.piecewise import token_buckets

    assert token_buckets(100) == [32, 64, 96, 100]
    assert token_buckets(64) == [32, 64]
    assert token_buckets(20) == [20]
    assert token_buckets(0) == []
