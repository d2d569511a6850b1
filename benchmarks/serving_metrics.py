"""Latency and throughput statistics for the serving benchmark."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np


@dataclass(slots=True)
class RequestRecord:
    prompt_len: int
    send_time: float
    token_times: list[float] = field(default_factory=list)  # arrival time of each streamed chunk
    chunk_tokens: list[int] = field(default_factory=list)  # tokens carried by each chunk
    output_len: int = 0
    ok: bool = True
    error: str = ""

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.send_time

    @property
    def latency(self) -> float:
        return self.token_times[-1] - self.send_time

    @property
    def tpot(self) -> float | None:
        if self.output_len <= 1:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (self.output_len - 1)

    def itls(self) -> list[float]:
        """Gap before each later chunk, spread over the tokens it carried."""
        gaps = []
        for i in range(1, len(self.token_times)):
            n = max(1, self.chunk_tokens[i])
            gaps.extend([(self.token_times[i] - self.token_times[i - 1]) / n] * n)
        return gaps


def _dist(values: list[float]) -> dict:
    if not values:
        return {"mean": None, "median": None, "p99": None}
    a = np.asarray(values) * 1000.0
    return {"mean": float(a.mean()), "median": float(np.median(a)), "p99": float(np.percentile(a, 99))}


def summarize(records: list, duration: float) -> dict:
    done = [r for r in records if r.ok and r.token_times]
    failed = len(records) - len(done)
    in_tok = sum(r.prompt_len for r in done)
    out_tok = sum(r.output_len for r in done)
    return {
        "completed": len(done),
        "failed": failed,
        "duration_s": duration,
        "request_throughput": len(done) / duration,
        "input_tok_s": in_tok / duration,
        "output_tok_s": out_tok / duration,
        "total_tok_s": (in_tok + out_tok) / duration,
        "ttft_ms": _dist([r.ttft for r in done]),
        "tpot_ms": _dist([t for r in done if (t := r.tpot) is not None]),
        "itl_ms": _dist([g for r in done for g in r.itls()]),
        "e2e_latency_ms": _dist([r.latency for r in done]),
        "errors": sorted({r.error for r in records if not r.ok})[:5],
    }


def table(results: dict) -> str:
    """Markdown table: one column per system."""
    names = list(results)
    rows = [
        ("req/s", lambda s: f"{s['request_throughput']:.2f}"),
        ("input tok/s", lambda s: f"{s['input_tok_s']:.0f}"),
        ("output tok/s", lambda s: f"{s['output_tok_s']:.0f}"),
        ("completed / failed", lambda s: f"{s['completed']} / {s['failed']}"),
    ]
    for metric in ("ttft_ms", "tpot_ms", "itl_ms"):
        for stat in ("mean", "median", "p99"):
            rows.append(
                (
                    f"{metric[:-3].upper()} {stat} (ms)",
                    lambda s, m=metric, st=stat: "-" if s.get(m, {}).get(st) is None else f"{s[m][st]:.1f}",
                )
            )
    lines = ["| metric | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for label, fmt in rows:
        lines.append(f"| {label} | " + " | ".join(fmt(results[n]) for n in names) + " |")
    return "\n".join(lines)


def records_to_json(records: list) -> list:
    return [asdict(r) for r in records]
