"""Engine-block hashes for prefix caching, from a trace's block ids (the run's setup).

vLLM hashes each full block chained onto its parent's hash; cbgym derives the same equality
from the chained block ids traces carry (:func:`block_hashes`), laid out per request as
:func:`cbgym.engine.prefix_cache.table_offsets` says.
"""

from __future__ import annotations

import numpy as np

from cbgym.engine.jit import no_alloc_kernel
from cbgym.engine.prefix_cache import table_offsets

__all__ = ["block_hashes"]


@no_alloc_kernel
def mix(x: np.uint64) -> np.uint64:
    """splitmix64's finaliser (wraps, as it should)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


_TRACED, _UNIQUE = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xD1B54A32D192ED03)


@no_alloc_kernel
def fill_hashes(prompt: np.ndarray, bs: int, off: np.ndarray, ids: np.ndarray,
                id_off: np.ndarray, lengths: np.ndarray, big: np.ndarray, salt: np.ndarray,
                donor: np.ndarray, out: np.ndarray) -> None:
    """:func:`block_hashes`' loop (``out``: uint64, laid out as ``off`` says)."""
    for r in range(len(prompt)):
        full = min(prompt[r] // big[r], lengths[r]) * big[r] if big[r] > 0 else 0
        d = donor[r]
        # the blocks the donor's ids name too (its prompt holds this one's prompt + output)
        lent = min(prompt[d] // big[d], lengths[d]) * big[d] if d >= 0 and big[d] > 0 else 0
        own = mix(np.uint64(r) ^ _UNIQUE)
        for j in range(off[r + 1] - off[r]):
            e = (j + 1) * bs
            if e <= full:
                h = traced_hash(ids, id_off[r], big[r], salt[r], e)
            elif e <= lent:
                h = traced_hash(ids, id_off[d], big[d], salt[d], e)
            else:
                h = mix(own ^ np.uint64(j))
            out[off[r] + j] = h


@no_alloc_kernel
def traced_hash(ids: np.ndarray, first: int, big: int, salt: int, e: int) -> np.uint64:
    """The hash of the prefix [0, e) named by a request's trace ids (starting at
    ``ids[first]``, one per ``big`` tokens): the id holding token e - 1, and how many of its
    tokens are in."""
    q = (e - 1) // big
    return mix(mix(np.uint64(ids[first + q]) ^ mix(np.uint64(salt) ^ _TRACED))
               ^ np.uint64(e - q * big))


def block_hashes(prompt: np.ndarray, output: np.ndarray, block_size: int,
                 hash_ids: np.ndarray | None, id_tokens: np.ndarray | None,
                 salt: np.ndarray | None = None,
                 donor: np.ndarray | None = None) -> np.ndarray:
    """Every request's engine-block hashes, laid out as :func:`table_offsets` says.

    ``hash_ids[r]``: request r's trace block ids, one per ``id_tokens[r]`` prompt tokens,
    chained (equal ids at k: equal tokens through trace block k, as Mooncake's). Engine block
    j covers tokens [0, e), e = (j + 1) x block_size; if those lie within the prompt's full
    trace blocks, the trace block q holding token e - 1 and how many of its tokens are in
    (e - q x B) name that prefix exactly, whatever the two block sizes. Anything else (a
    partial last trace block, generated tokens, a request without ids) is the request's own:
    a hash no other request has, so only the request itself finds it again (after a
    preemption). ``salt[r]`` (a tenant id, say) keeps equal prefixes of different salts apart,
    as vLLM's ``cache_salt``. ``donor[r]`` (-1: none): a later request whose prompt holds
    r's prompt and output (a session's next turn): r's blocks past its own full trace blocks
    that the donor's ids cover take the donor's hashes, so the next turn finds the blocks r
    computed for its response, as vLLM would. Equality is all that matters: 64-bit mixes,
    collisions as unlikely as vLLM's own.
    """
    prompt = np.ascontiguousarray(prompt, np.int64)
    n = len(prompt)
    off = table_offsets(prompt, output, block_size)
    if hash_ids is None or id_tokens is None:
        hash_ids, id_tokens = np.empty(n, dtype=object), np.zeros(n, np.int64)
        hash_ids[:] = [()] * n
    lengths = np.fromiter((len(h) for h in hash_ids), np.int64, n)
    flat = np.fromiter((x for h in hash_ids for x in h), np.int64, int(lengths.sum()))
    id_off = np.concatenate(([0], np.cumsum(lengths)))[:-1].astype(np.int64)
    salts = np.zeros(n, np.int64) if salt is None else np.asarray(salt, np.int64)
    out = np.zeros(int(off[-1]), np.uint64)
    donors = np.full(n, -1, np.int64) if donor is None else np.asarray(donor, np.int64)
    with np.errstate(over="ignore"):  # (NUMBA_DISABLE_JIT: numpy scalars warn as they wrap)
        fill_hashes(prompt, np.int64(block_size), off, flat, id_off, lengths,
                    np.ascontiguousarray(id_tokens, np.int64), salts, donors, out)
    return out.view(np.int64)
