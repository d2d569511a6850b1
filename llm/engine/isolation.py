"""Pinning a failed step on the request that caused it, so that request fails alone.

A launch that raises is retried in parts: the step's requests (the completions of one request stay
together) split in halves, each half launched and waited for on its own, a half that fails split
again, down to single requests. A request whose launch alone fails is the culprit and fails with
that error; every other request gets the token of the part it ran in, so the step completes for it.
A failure that needs the whole batch to happen (none of the parts fails) just runs that step in parts.

The parts rerun the same scheduled tokens: their K/V lands in the same slots with the same values,
and a seeded row's draw depends only on (seed, completion index, position) (sampler.py), so every
surviving row gets the token the whole batch would have given it.
"""

from __future__ import annotations

import logging

from vlchat.llm.engine.sampler import SamplerOutput
from vlchat.llm.engine.sequence import Sequence

logger = logging.getLogger(__name__)


class IsolatedStep:
    """The tokens of a step that ran in parts, already on the host (stands in for a `PendingSample`)."""

    def __init__(self, output: SamplerOutput) -> None:
        self.output = output

    def result(self) -> SamplerOutput:
        return self.output


def launch_isolated(runner, seqs: list[Sequence], error: Exception) -> tuple[IsolatedStep, dict[str, Exception]]:
    """Rerun the step over `seqs` (whose launch raised `error`) in parts; returns the step's tokens for the sequences
    of the requests that did not fail (in the order of `seqs`) and the requests that did, with their errors."""
    before = runner.sampled_state()
    groups: dict[str, list[Sequence]] = {}
    for seq in seqs:
        groups.setdefault(seq.request_id, []).append(seq)
    sampled: dict[int, tuple[int, dict | None]] = {}  # seq_id -> (token, logprobs)
    failed: dict[str, Exception] = {}

    def bisect(part: list[list[Sequence]], part_error: Exception) -> None:
        if len(part) == 1:
            failed[part[0][0].request_id] = part_error
            return
        mid = len(part) // 2
        for half in (part[:mid], part[mid:]):
            batch = sorted((s for group in half for s in group), key=lambda s: s.num_new_tokens > 1)  # decodes first
            runner.restore_sampled_state(before)  # async scheduling: each part reads the previous step's tokens
            try:
                out = runner.launch(batch).result()
            except Exception as e:  # noqa: BLE001 - narrowed down further, then failed alone
                bisect(half, e)
                continue
            samplers = [s for s in batch if s.samples_this_step]
            for seq, token, logprobs in zip(samplers, out.token_ids, out.logprobs, strict=True):
                sampled[seq.seq_id] = (token, logprobs)

    if groups:
        bisect(list(groups.values()), error)
    survivors = [s for s in seqs if s.samples_this_step and s.request_id not in failed]
    tokens = [sampled[s.seq_id][0] for s in survivors]
    runner.adopt_sampled(survivors, tokens)
    for request_id, e in failed.items():
        logger.error("request %s failed a step on its own (%s: %s); the others go on", request_id, type(e).__name__, e,
                     exc_info=e)  # fmt: skip
    if not failed:
        logger.warning("a step failed as a whole (%s: %s) but not in parts; it ran in parts", type(error).__name__,
                       error, exc_info=error)  # fmt: skip
    return IsolatedStep(SamplerOutput(tokens, [sampled[s.seq_id][1] for s in survivors])), failed
