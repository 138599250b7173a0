"""vLLM v1's automatic prefix caching, compiled: named KV blocks, an LRU free queue, a hash map.

Without prefix caching the engine counts blocks (:mod:`cbgym.engine.kutil`); with it, which
block holds what matters, so blocks get names. The rules are vLLM's (``BlockPool``,
``FreeKVCacheBlockQueue``, ``FullAttentionManager`` in vLLM 0.32; checked against its own
scheduler by ``tests/test_vllm_conformance.py``):

- Only full blocks are cached, under a hash that stands for the whole prefix through the
  block (vLLM chains each block's tokens onto its parent's hash; cbgym derives the same
  equality from a trace's block ids, :mod:`cbgym.engine.prefix_hashes`). A block is
  registered when the iteration that fills it is scheduled, so a request admitted later in
  the same iteration already finds it.
- Admission looks up the longest run of leading cached blocks, at most ``tokens - 1``
  tokens' worth (the last token is always computed, for its logits); the request's
  computed tokens start there. A hit on a free block (nobody holds it) takes it out of the
  free queue: it counts against the free blocks the admission needs.
- Freed blocks go back to the free queue in reverse order (a request's tail before its
  prefix): blocks without a hash at the front (reused first), cached ones at the back. A new
  block is the front of the queue; if it was cached its hash is evicted then, lazily.
- ``kv_cache_usage_perc`` counts cached-but-free blocks as free: ``si[FREE]`` is the free
  queue's length.

State (:mod:`cbgym.engine.layout`): ``State.blocks`` has a column per block (references,
hash, free-queue links; column ``num_blocks`` is the queue's sentinel), ``State.cache`` is an
open-addressing hash map (linear probing, backward-shift deletion) from a hash to the first
block that holds it (duplicates chain through ``B_SAME`` in insertion order, as vLLM's dict),
and ``State.tables`` holds each request's block table and block hashes from
``req[TABLE]`` on. A request's ``HELD`` is its table's length.
"""

from __future__ import annotations

import numpy as np

from cbgym.engine.jit import no_alloc_kernel
from cbgym.engine.layout import (
    B_HASH,
    B_HASHED,
    B_NEXT,
    B_PREV,
    B_REF,
    B_SAME,
    FREE,
    HELD,
    LOOKUP,
    N_CACHED,
    N_WAIT,
    NUM_BLOCK_ROWS,
    PC_EVICTED,
    PROMPT,
    TABLE,
    TOKENS,
    WAIT_Q,
    State,
)

EMPTY = np.int64(-1)


# ------------------------------------------------------------------ setup
def table_offsets(prompt: np.ndarray, output: np.ndarray, block_size: int) -> np.ndarray:
    """Where each request's block table starts in ``State.tables`` (n + 1 entries): room for
    the blocks of its prompt and whole output."""
    sizes = -(-(np.asarray(prompt, np.int64) + np.asarray(output, np.int64)) // block_size)
    return np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)


def map_capacity(num_blocks: int) -> int:
    """Hash-map slots: a power of two at least twice the blocks (at most one hash per block
    is mapped, so the load stays under one half)."""
    return 1 << max(int(2 * num_blocks - 1).bit_length(), 1)


def empty_pool(num_blocks: int, total_table: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """State.blocks, State.cache and State.tables for a run with prefix caching."""
    return (np.zeros((NUM_BLOCK_ROWS, num_blocks + 1), np.int64),
            np.zeros((2, map_capacity(num_blocks)), np.int64),
            np.zeros((2, max(total_table, 1)), np.int64))


def no_pool() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The same three arrays for a run without (one column each: one numba type)."""
    return (np.zeros((NUM_BLOCK_ROWS, 1), np.int64), np.zeros((2, 1), np.int64),
            np.zeros((2, 1), np.int64))


@no_alloc_kernel
def reset_pool(s: State, num_blocks: int, offsets: np.ndarray, hashes: np.ndarray) -> None:
    """Start a run's named blocks: all free, queued in id order (vLLM's initial free queue),
    nothing cached; request tables empty, their hashes ``hashes``, request j's table at
    ``offsets[j] - offsets[0]`` (``offsets``: n + 1 entries, :func:`table_offsets`, or a
    window's slice of a whole trace's, as the native vector env starts its episodes). The
    sentinel is the last column (a cluster's instances share array shapes: a smaller one
    leaves columns unused)."""
    b, nb = s.blocks, num_blocks
    sentinel = b.shape[1] - 1
    for k in range(b.shape[1]):
        b[B_REF, k] = 0
        b[B_HASHED, k] = 0
        b[B_HASH, k] = 0
        b[B_SAME, k] = EMPTY
    for k in range(nb - 1):
        b[B_NEXT, k] = k + 1
        b[B_PREV, k + 1] = k
    b[B_NEXT, nb - 1] = sentinel
    b[B_NEXT, sentinel] = 0
    b[B_PREV, 0] = sentinel
    b[B_PREV, sentinel] = nb - 1
    for k in range(s.cache.shape[1]):
        s.cache[1, k] = EMPTY
    for k in range(s.tables.shape[1]):
        s.tables[0, k] = EMPTY
    for k in range(len(hashes)):
        s.tables[1, k] = hashes[k]
    table = s.req[TABLE]
    for j in range(len(offsets) - 1):
        table[j] = offsets[j] - offsets[0]


# ------------------------------------------------------------------ the free queue
@no_alloc_kernel
def queue_remove(b: np.ndarray, k: int) -> None:
    prev, nxt = b[B_PREV, k], b[B_NEXT, k]
    b[B_NEXT, prev] = nxt
    b[B_PREV, nxt] = prev


@no_alloc_kernel
def queue_insert_after(b: np.ndarray, at: int, k: int) -> None:
    nxt = b[B_NEXT, at]
    b[B_PREV, k], b[B_NEXT, k] = at, nxt
    b[B_NEXT, at] = k
    b[B_PREV, nxt] = k


# ------------------------------------------------------------------ the hash map
@no_alloc_kernel
def find_slot(cache: np.ndarray, h: int) -> int:
    """The slot holding ``h``, or the empty slot where it would go."""
    mask = cache.shape[1] - 1
    i = h & mask
    while cache[1, i] != EMPTY and cache[0, i] != h:
        i = (i + 1) & mask
    return i


@no_alloc_kernel
def cached_block(s: State, h: int) -> int:
    """The first block cached under ``h`` (vLLM's ``get_one_block``), or -1."""
    return s.cache[1, find_slot(s.cache, h)]


@no_alloc_kernel
def delete_slot(cache: np.ndarray, i: int) -> None:
    """Empty slot i, shifting later entries of its probe run back (no tombstones)."""
    mask = cache.shape[1] - 1
    cache[1, i] = EMPTY
    j = i
    while True:
        j = (j + 1) & mask
        if cache[1, j] == EMPTY:
            return
        home = cache[0, j] & mask
        # j's entry may move to i unless its home lies cyclically in (i, j]
        if (i <= j and (home <= i or home > j)) or (i > j and home <= i and home > j):
            cache[0, i], cache[1, i] = cache[0, j], cache[1, j]
            cache[1, j] = EMPTY
            i = j


@no_alloc_kernel
def register(s: State, k: int, h: int) -> None:
    """Cache block k under hash h (after the blocks already there: vLLM's dict order)."""
    b = s.blocks
    b[B_HASH, k], b[B_HASHED, k], b[B_SAME, k] = h, 1, EMPTY
    i = find_slot(s.cache, h)
    if s.cache[1, i] == EMPTY:
        s.cache[0, i], s.cache[1, i] = h, k
        return
    last = s.cache[1, i]
    while b[B_SAME, last] != EMPTY:
        last = b[B_SAME, last]
    b[B_SAME, last] = k


@no_alloc_kernel
def evict(s: State, k: int) -> None:
    """Take block k's hash out of the cache (it is being reused)."""
    b = s.blocks
    if not b[B_HASHED, k]:
        return
    i = find_slot(s.cache, b[B_HASH, k])
    head = s.cache[1, i]
    if head == k:
        if b[B_SAME, k] == EMPTY:
            delete_slot(s.cache, i)
        else:
            s.cache[1, i] = b[B_SAME, k]
    else:
        while b[B_SAME, head] != k:
            head = b[B_SAME, head]
        b[B_SAME, head] = b[B_SAME, k]
    b[B_HASHED, k], b[B_SAME, k] = 0, EMPTY
    s.si[PC_EVICTED] += 1


# ------------------------------------------------------------------ a request's blocks
@no_alloc_kernel
def take(s: State, rid: int, n: int) -> None:
    """Give ``rid`` the next ``n`` blocks of the free queue (the caller checked there are
    enough), evicting their cached hashes."""
    b, table = s.blocks, s.tables[0]
    sentinel = b.shape[1] - 1
    at = s.req[TABLE, rid] + s.req[HELD, rid]
    for _ in range(n):
        k = b[B_NEXT, sentinel]
        queue_remove(b, k)
        evict(s, k)
        b[B_REF, k] = 1
        table[at] = k
        at += 1
    s.req[HELD, rid] += n
    s.si[FREE] -= n


@no_alloc_kernel
def give_back(s: State, rid: int) -> None:
    """Free every block ``rid`` holds, tail first: unhashed ones to the queue's front (in
    that order), cached ones to its back."""
    b, table = s.blocks, s.tables[0]
    sentinel = b.shape[1] - 1
    base, held = s.req[TABLE, rid], s.req[HELD, rid]
    front = sentinel  # the last block put at the front so far
    for j in range(held - 1, -1, -1):
        k = table[base + j]
        table[base + j] = EMPTY
        b[B_REF, k] -= 1
        if b[B_REF, k] == 0:
            s.si[FREE] += 1
            if b[B_HASHED, k]:
                queue_insert_after(b, b[B_PREV, sentinel], k)
            else:
                queue_insert_after(b, front, k)
                front = k
    s.req[HELD, rid] = 0
    s.req[N_CACHED, rid] = 0


@no_alloc_kernel
def lookup(s: State, rid: int, max_tokens: int, block_size: int) -> tuple[int, int]:
    """The leading cached blocks of waiting ``rid`` (holding none), at most ``max_tokens``
    tokens' worth: how many, and how many of them are free (taking them costs free blocks).
    They are written into its table, not yet held (:func:`adopt` takes them)."""
    base = s.req[TABLE, rid]
    table, hashes, ref = s.tables[0], s.tables[1], s.blocks[B_REF]
    hits = free = np.int64(0)
    for j in range(max_tokens // block_size):
        k = cached_block(s, hashes[base + j])
        if k < 0:
            break
        table[base + j] = k
        hits += 1
        free += ref[k] == 0
    return hits, free


@no_alloc_kernel
def adopt(s: State, rid: int, hits: int) -> None:
    """``rid`` takes the ``hits`` cached blocks :func:`lookup` found (vLLM's ``touch``)."""
    b, table = s.blocks, s.tables[0]
    base = s.req[TABLE, rid]
    for j in range(hits):
        k = table[base + j]
        if b[B_REF, k] == 0:
            queue_remove(b, k)
            s.si[FREE] -= 1
        b[B_REF, k] += 1
    s.req[HELD, rid] = hits
    s.req[N_CACHED, rid] = hits


@no_alloc_kernel
def cache_full(s: State, rid: int, num_tokens: int, block_size: int) -> None:
    """Register ``rid``'s blocks that ``num_tokens`` computed tokens fill (vLLM's
    ``cache_blocks``, at allocation: the tokens scheduled this iteration count)."""
    full, done = num_tokens // block_size, s.req[N_CACHED, rid]
    if full <= done:
        return
    base = s.req[TABLE, rid]
    table, hashes, b = s.tables[0], s.tables[1], s.blocks
    for j in range(done, full):
        k, h = table[base + j], hashes[base + j]
        if not (b[B_HASHED, k] and b[B_HASH, k] == h):
            register(s, k, h)
    s.req[N_CACHED, rid] = full


@no_alloc_kernel
def cached_run(s: State, rid: int, limit: int, block_size: int) -> int:
    """How many of ``rid``'s leading blocks are cached now, at most ``limit`` (nothing is
    taken)."""
    base, hashes = s.req[TABLE, rid], s.tables[1]
    j = np.int64(0)
    while j < limit and cached_block(s, hashes[base + j]) >= 0:
        j += 1
    return j


@no_alloc_kernel
def probe_waiting(s: State, block_size: int) -> None:
    """``req[LOOKUP]`` of every waiting request: the tokens its admission would find cached
    now (as :func:`lookup`, at most tokens - 1; nothing is taken). Content-blind: which
    blocks are resident is engine state, as KV pressure is."""
    tokens, out, waiting = s.req[TOKENS], s.req[LOOKUP], s.ids[WAIT_Q]
    for i in range(s.si[N_WAIT]):
        rid = waiting[i]
        out[rid] = cached_run(s, rid, (tokens[rid] - 1) // block_size, block_size) * block_size


def shared_blocks(s: State, ids: np.ndarray, block_size: int) -> np.ndarray:
    """For each request of ``ids``: how many of its full prompt blocks some other request of
    ``ids`` also has (equal prefixes: admitted together they would share them)."""
    prompt, base = s.req[PROMPT, ids], s.req[TABLE, ids]
    full = prompt // block_size
    owner = np.repeat(np.arange(len(ids)), full)
    where = np.repeat(base, full) + (np.arange(int(full.sum())) - np.repeat(
        np.cumsum(full) - full, full))
    h = s.tables[1, where]
    _, inverse, counts = np.unique(h, return_inverse=True, return_counts=True)
    return np.bincount(owner, weights=counts[inverse] > 1, minlength=len(ids)).astype(np.int64)


@no_alloc_kernel
def in_use(s: State) -> int:
    """Blocks some request holds (the invariant: ``in_use + si[FREE] == num_blocks``)."""
    ref = s.blocks[B_REF]
    n = np.int64(0)
    for k in range(len(ref) - 1):  # (unused columns of a smaller instance: never held)
        n += ref[k] > 0
    return n


@no_alloc_kernel
def probe(s: State, rid: int, block_size: int) -> int:
    """The tokens of ``rid`` this state's cache holds now, as admission would find them (at
    most prompt - 1; a router's view of each instance's cache)."""
    return cached_run(s, rid, (s.req[PROMPT, rid] - 1) // block_size, block_size) * block_size
