"""Paged KV blocks: allocation with reference counts and an automatic prefix cache.

Plain Python, no tensors. A block is a slot range [id * block_size, (id + 1) * block_size)
of the KV cache tensors the model runner owns.

Prefix cache: once a block is full and its K/V computed, it is registered under
the chained hash of its content (`Sequence.block_hash`: previous block's hash,
token ids, images). A new sequence whose leading full blocks hash the same reuses
them (ref count + 1) instead of recomputing. A block whose ref count drops to 0
keeps its content and hash and goes to the back of an LRU list of free cached
blocks; with blocks taken one at a time (`run_blocks` 1) allocation takes
never-hashed free blocks first, then evicts the least recently freed cached block.

Runs: with `run_blocks` > 1 (the engine sizes a run to RUN_BYTES of one layer's K cache) blocks are
grouped into aligned runs, and a sequence's table is kept in stretches of consecutive ids: a sequence that
grows takes the id after its last block where that one is free, else starts a wholly free run, else the
longest free stretch that no other table would continue into (`_take_free`). Sequences growing together
(a decode batch takes a block every block_size steps) would otherwise interleave their blocks one by one.
Pages read in stretches of RUN_BYTES or more read as fast as pages in order, shuffled single pages slower
(docs/PERF.md#engine-and-host). Cached content is kept as before while never-hashed blocks are free; once
none is, the eviction prefers a table's next id within its run and wholly free runs (oldest first) to the least
recently freed block.
"""

from __future__ import annotations

from collections import OrderedDict

from vlchat.llm.engine.sequence import Sequence

RUN_BYTES = 512 << 10  # a run of blocks spans this much of one layer's K cache (the module docstring says why)
STRETCH_CANDIDATES = 8  # free blocks _take_free weighs where no run is wholly free


def run_blocks_for(block_bytes: int) -> int:
    """Blocks per run for blocks of `block_bytes` in one layer's K cache (at least 1)."""
    return max(1, RUN_BYTES // max(1, block_bytes))


class Block:
    __slots__ = ("block_id", "ref_count", "hash")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.hash: bytes | None = None


class BlockManager:
    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True, run_blocks: int = 1
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.run_blocks = max(1, run_blocks)
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_plain: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # no content; oldest first
        self.free_cached: OrderedDict[int, None] = OrderedDict()  # free, content kept; oldest first
        self.hash_to_block: dict[bytes, int] = {}
        runs = -(-num_blocks // self.run_blocks)
        self.run_sizes = [min(self.run_blocks, num_blocks - r * self.run_blocks) for r in range(runs)]
        self.run_plain = list(self.run_sizes)  # never-hashed free blocks per run
        self.run_free = list(self.run_sizes)  # free blocks (never-hashed or cached) per run
        self.plain_runs: OrderedDict[int, None] = OrderedDict.fromkeys(range(runs))  # wholly never-hashed free
        self.free_runs: OrderedDict[int, None] = OrderedDict.fromkeys(range(runs))  # wholly free; oldest first
        self.tails: dict[int, int] = {}  # a block to the number of sequences whose table ends in it

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_plain) + len(self.free_cached)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- prefix cache -------------------------------------------------------

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Block ids of the longest cached run of seq's leading full blocks (not acquired yet).

        At least one token is left to compute, since the last row must produce logits.
        """
        if not self.enable_prefix_caching:
            return []
        hits = []
        for i in range((len(seq) - 1) // self.block_size):
            block_id = self.hash_to_block.get(seq.block_hash(i))
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register the hashes of seq's blocks that became full and computed."""
        if not self.enable_prefix_caching:
            return
        # a block whose last token is still on the device (async scheduling) is hashed once it arrives
        full = min(seq.num_computed_tokens, len(seq)) // self.block_size
        for i in range(seq.num_hashed_blocks, full):
            block = self.blocks[seq.block_table[i]]
            if block.hash is None:
                h = seq.block_hash(i)
                if h not in self.hash_to_block:  # else an identical block is already cached
                    block.hash = h
                    self.hash_to_block[h] = block.block_id
        seq.num_hashed_blocks = max(seq.num_hashed_blocks, full)

    # -- allocation ---------------------------------------------------------

    def num_blocks_to_take(self, seq: Sequence, num_tokens: int, prefix: list[int] = ()) -> int:
        """Free blocks consumed if seq grows to `num_tokens` slots, reusing `prefix` (from match_prefix)."""
        if not prefix and num_tokens <= len(seq.block_table) * self.block_size:
            return 0  # the common decode step: the last block still has room
        new = max(0, self.blocks_for(num_tokens) - len(seq.block_table) - len(prefix))
        revived = sum(1 for b in prefix if self.blocks[b].ref_count == 0)
        return new + revived

    def can_allocate(self, seq: Sequence, num_tokens: int, prefix: list[int] = ()) -> bool:
        need = self.num_blocks_to_take(seq, num_tokens, prefix)
        return need == 0 or need <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_tokens: int, prefix: list[int] = ()) -> None:
        """Grow seq's block table to hold `num_tokens` slots, first acquiring the cached `prefix`."""
        if not prefix and num_tokens <= len(seq.block_table) * self.block_size:
            return
        assert self.can_allocate(seq, num_tokens, prefix), "call can_allocate first"
        tail = seq.block_table[-1] if seq.block_table else None
        if prefix:
            assert not seq.block_table, "a prefix is only reused by a sequence without blocks"
            for block_id in prefix:
                self._acquire(block_id)
            seq.block_table = list(prefix)
            seq.num_computed_tokens = len(prefix) * self.block_size
            seq.num_hashed_blocks = len(prefix)
        while len(seq.block_table) < self.blocks_for(num_tokens):
            seq.block_table.append(self._take_free(seq.block_table[-1] if seq.block_table else None))
        self._move_tail(tail, seq.block_table[-1])

    def free(self, seq: Sequence) -> None:
        """Release seq's blocks (last block first, so a sequence's tail is evicted before its head)."""
        if seq.block_table:
            self._move_tail(seq.block_table[-1], None)
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0
            if block.ref_count == 0:
                self._mark_free(block_id)
        seq.block_table = []
        seq.num_hashed_blocks = 0

    def _acquire(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            self._mark_taken(block_id)
        block.ref_count += 1

    def _take_free(self, after: int | None) -> int:
        """A free block for a sequence whose last block is `after` (None: it has none yet). While never-hashed
        blocks are free no cached block is evicted; among them, the first of: the id after `after`; the first
        block of the oldest wholly never-hashed run; the best stretch start (`_stretch_start`). Then, evicting:
        the id after `after` within its run; the first block of the oldest wholly free run; the best stretch start
        among the cached blocks, least recently freed first. With runs of one block this is the free lists'
        order alone: never-hashed first, then LRU eviction."""
        nxt = after + 1 if self.run_blocks > 1 and after is not None and after + 1 < self.num_blocks else -1
        if nxt in self.free_plain:
            block_id = nxt
        elif self.plain_runs:
            block_id = next(iter(self.plain_runs)) * self.run_blocks
        elif self.free_plain:
            block_id = self._stretch_start(self.free_plain)
        elif nxt in self.free_cached and nxt % self.run_blocks:  # not across a run's edge: the next run's first
            block_id = nxt  # block may start another request's cached prefix
        elif self.free_runs:
            block_id = next(iter(self.free_runs)) * self.run_blocks
        else:
            block_id = self._stretch_start(self.free_cached)
        block = self.blocks[block_id]
        self._mark_taken(block_id)
        if block.hash is not None:  # evicted
            del self.hash_to_block[block.hash]
            block.hash = None
        block.ref_count = 1
        return block_id

    def _is_free(self, block_id: int) -> bool:
        return block_id in self.free_plain or block_id in self.free_cached

    def _stretch_start(self, free: OrderedDict[int, None]) -> int:
        """Of the first STRETCH_CANDIDATES blocks of `free` (a free list, oldest first) that continue no table (a
        free block right after a table's last is that table's continuation), the one that starts the longest
        stretch of free blocks (up to a run); the oldest where each continues a table."""
        best, longest, seen = -1, 0, 0
        for block_id in free:
            if block_id - 1 in self.tails:
                continue
            n = 1
            while n < self.run_blocks and self._is_free(block_id + n):
                n += 1
            if n > longest:
                best, longest = block_id, n
            seen += 1
            if seen == STRETCH_CANDIDATES or n == self.run_blocks:
                break
        return best if best >= 0 else next(iter(free))

    def _move_tail(self, old: int | None, new: int | None) -> None:
        """A sequence's table now ends in `new` instead of `old` (None: no table)."""
        if old == new:
            return
        if old is not None:
            if self.tails[old] == 1:
                del self.tails[old]
            else:
                self.tails[old] -= 1
        if new is not None:
            self.tails[new] = self.tails.get(new, 0) + 1

    def _mark_free(self, block_id: int) -> None:
        """A block whose last reference went: to the back of its free list, and its run's counts."""
        run = block_id // self.run_blocks
        self.run_free[run] += 1
        if self.run_free[run] == self.run_sizes[run]:
            self.free_runs[run] = None
        if self.blocks[block_id].hash is not None:
            self.free_cached[block_id] = None
            return
        self.free_plain[block_id] = None
        self.run_plain[run] += 1
        if self.run_plain[run] == self.run_sizes[run]:
            self.plain_runs[run] = None

    def _mark_taken(self, block_id: int) -> None:
        """A free block taken (allocated, or a cached one acquired again): off its free list and its run's."""
        run = block_id // self.run_blocks
        self.run_free[run] -= 1
        self.free_runs.pop(run, None)
        if block_id in self.free_plain:  # it was never hashed
            del self.free_plain[block_id]
            self.run_plain[run] -= 1
            self.plain_runs.pop(run, None)
        else:
            del self.free_cached[block_id]
