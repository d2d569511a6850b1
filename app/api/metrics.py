"""GET /metrics in the Prometheus text format, under vLLM's metric names where they mean the same, so that
dashboards made for vLLM work.

Gauges are read from the engine at each scrape (`AsyncEngine.stats`); request histograms and token counters are
observed when a request finishes, by `MeteredEngine`, which every caller of the engine (API, browser UI) goes
through. A request that is aborted (client gone) is not observed.
"""

from __future__ import annotations

from contextlib import aclosing

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)


class _EngineCollector:
    def __init__(self, engine, model_name: str) -> None:
        self.engine, self.model_name = engine, model_name

    def collect(self):
        stats = self.engine.stats()
        labels = [self.model_name]
        for name, doc, value in (
            ("vllm:num_requests_running", "Sequences in the running batch.", stats.num_running),
            ("vllm:num_requests_waiting", "Sequences waiting to be scheduled.", stats.num_waiting),
            ("vllm:kv_cache_usage_perc", "Fraction of KV cache blocks in use (1 = full).", stats.kv_cache_usage),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=["model_name"])
            gauge.add_metric(labels, value)
            yield gauge
        preemptions = CounterMetricFamily("vllm:num_preemptions", "Sequences preempted for KV blocks.",
                                          labels=["model_name"])  # fmt: skip
        preemptions.add_metric(labels, stats.num_preemptions)
        yield preemptions


class Metrics:
    """The server's registry and the request-level series."""

    def __init__(self, engine, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        self.registry.register(_EngineCollector(engine, model_name))
        label = ["model_name"]
        reg = self.registry
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to the first token.", label,
                              buckets=_LATENCY_BUCKETS, registry=reg)  # fmt: skip
        self.tpot = Histogram("vllm:time_per_output_token_seconds", "Time per output token after the first.", label,
                              buckets=_TOKEN_BUCKETS, registry=reg)  # fmt: skip
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Arrival to finish of a request.", label,
                             buckets=_LATENCY_BUCKETS, registry=reg)  # fmt: skip
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens of finished requests.", label, registry=reg)
        self.generation_tokens = Counter("vllm:generation_tokens", "Generated tokens of finished requests.", label,
                                         registry=reg)  # fmt: skip
        self.prefix_queries = Counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                                      label, registry=reg)  # fmt: skip
        self.prefix_hits = Counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.", label,
                                   registry=reg)  # fmt: skip
        self.success = Counter("vllm:request_success", "Finished requests by finish reason.",
                               ["model_name", "finished_reason"], registry=reg)  # fmt: skip

    def observe(self, output) -> None:
        """Record a finished RequestOutput."""
        m, name = output.metrics, self.model_name
        prompt = len(output.prompt_token_ids)
        generated = sum(len(c.token_ids) for c in output.outputs)
        self.prompt_tokens.labels(name).inc(prompt)
        self.generation_tokens.labels(name).inc(generated)
        self.prefix_queries.labels(name).inc(prompt)
        self.prefix_hits.labels(name).inc(output.num_cached_tokens)
        for c in output.outputs:
            self.success.labels(name, c.finish_reason or "unknown").inc()
        if m is None:
            return
        self.e2e.labels(name).observe(m.e2e_latency)
        if m.time_to_first_token is not None:
            self.ttft.labels(name).observe(m.time_to_first_token)
            longest = max((len(c.token_ids) for c in output.outputs), default=0)
            if longest > 1:
                self.tpot.labels(name).observe((m.finished_time - m.first_token_time) / (longest - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MeteredEngine:
    """The engine with every finished request recorded in `metrics`; everything else passes through."""

    def __init__(self, engine, metrics: Metrics) -> None:
        self._engine, self.metrics = engine, metrics

    def __getattr__(self, name):
        return getattr(self._engine, name)

    async def generate(self, *args, **kwargs):
        async with aclosing(self._engine.generate(*args, **kwargs)) as outputs:  # closing this aborts the request
            async for output in outputs:
                if output.finished:
                    self.metrics.observe(output)
                yield output
