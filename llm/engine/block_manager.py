"""Paged KV blocks: allocation with reference counts and an automatic prefix cache.

Plain Python, no tensors. A block is a slot range [id * block_size, (id + 1) * block_size)
of the KV cache tensors the model runner owns.

Prefix cache: once a block is full and its K/V computed, it is registered under
the chained hash of its content (`Sequence.block_hash`: previous block's hash,
token ids, images). A new sequence whose leading full blocks hash the same reuses
them (ref count + 1) instead of recomputing. A block whose ref count drops to 0
keeps its content and hash and goes to the back of an LRU list of free cached
blocks; allocation takes never-hashed free blocks first, then evicts the least
recently freed cached block.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from llm.engine.sequence import Sequence


class Block:
    __slots__ = ("block_id", "ref_count", "hash")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.hash: bytes | None = None


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_plain: deque[int] = deque(range(num_blocks))  # free, no cached content
        self.free_cached: OrderedDict[int, None] = OrderedDict()  # free, content kept; oldest first
        self.hash_to_block: dict[bytes, int] = {}

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
        if prefix:
            assert not seq.block_table, "a prefix is only reused by a sequence without blocks"
            for block_id in prefix:
                self._acquire(block_id)
            seq.block_table = list(prefix)
            seq.num_computed_tokens = len(prefix) * self.block_size
            seq.num_hashed_blocks = len(prefix)
        while len(seq.block_table) < self.blocks_for(num_tokens):
            seq.block_table.append(self._take_free())

    def free(self, seq: Sequence) -> None:
        """Release seq's blocks (last block first, so a sequence's tail is evicted before its head)."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0
            if block.ref_count == 0:
                if block.hash is not None:
                    self.free_cached[block_id] = None
                else:
                    self.free_plain.append(block_id)
        seq.block_table = []
        seq.num_hashed_blocks = 0

    def _acquire(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free_cached[block_id]
        block.ref_count += 1

    def _take_free(self) -> int:
        if self.free_plain:
            block_id = self.free_plain.popleft()
        else:
            block_id, _ = self.free_cached.popitem(last=False)  # evict the least recently freed
            block = self.blocks[block_id]
            del self.hash_to_block[block.hash]
            block.hash = None
        self.blocks[block_id].ref_count = 1
        return block_id
