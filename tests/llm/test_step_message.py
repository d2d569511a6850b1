"""Step messages: after every step a worker's mirrored sequences equal the scheduler's (plain Python, no workers)."""

from __future__ import annotations

import pickle

from vlchat.llm.engine.sequence import Sequence
from vlchat.llm.engine.step_message import SequenceMirror, StepEncoder
from vlchat.llm.inputs import MultiModalPrompt
from vlchat.llm.sampling_params import SamplingParams

BS = 4


def _state(seq: Sequence) -> tuple:
    return (seq.seq_id, seq.request_id, seq.token_ids, seq.block_table, seq.num_computed_tokens, seq.num_new_tokens,
            seq.num_pending, seq.num_prompt_tokens, seq.params.temperature, seq.samples_this_step)  # fmt: skip


def _send(encoder: StepEncoder, mirror: SequenceMirror, seqs: list[Sequence]):
    message = pickle.loads(pickle.dumps(encoder.encode(seqs)))  # as it travels
    got = mirror.apply(message)
    assert [_state(s) for s in got] == [_state(s) for s in seqs]
    return message


def test_mirror_follows_prefill_decode_preemption_and_finish():
    a = Sequence("a", MultiModalPrompt(list(range(10))), SamplingParams(temperature=0.5), BS)
    b = Sequence("b", MultiModalPrompt([7, 8, 9]), SamplingParams(), BS)
    encoder, mirror = StepEncoder(), SequenceMirror(BS)

    a.block_table, a.num_new_tokens = [5, 6, 7], 10  # whole prompt
    first = _send(encoder, mirror, [a])
    assert first.rows[0].init is not None and first.rows[0].tokens == []  # the prompt travels once, in init
    a.num_computed_tokens, a.num_new_tokens = 10, 1
    a.append_token(42)
    b.block_table, b.num_new_tokens = [1], 3
    step = _send(encoder, mirror, [a, b])
    assert step.rows[0].init is None and step.rows[0].tokens == [42] and step.rows[0].blocks == []

    a.num_computed_tokens, a.num_pending = 11, 1  # async scheduling: a's next token is still on the device
    a.block_table.append(9)
    b.num_computed_tokens, b.num_new_tokens = 3, 1
    step = _send(encoder, mirror, [a, b])
    assert step.rows[0].blocks == [9] and not step.rows[0].table_reset

    a.append_token(43)
    a.reset_for_recompute()  # preempted: its new table is sent whole
    a.block_table, a.num_new_tokens, a.num_pending = [2, 3, 4], 12, 0
    step = _send(encoder, mirror, [a])
    assert step.rows[0].table_reset and step.rows[0].blocks == [2, 3, 4]

    b.finish("stop")
    step = _send(encoder, mirror, [a])
    assert step.finished == [b.seq_id] and b.seq_id not in mirror.seqs
