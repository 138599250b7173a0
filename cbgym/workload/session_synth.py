"""A synthetic multi-turn session generator with prefix-block identities (the conventions of
:mod:`cbgym.workload.sessions`): each turn's prompt is the previous prompt and response plus a
new user message, and sessions may share a system prompt."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import ArrayLike

from cbgym.workload.sessions import _sessions_trace
from cbgym.workload.trace import Trace

__all__ = ["synthetic_sessions"]

Sampler = Callable[[np.random.Generator, int], ArrayLike]


def _default_user_tokens(rng: np.random.Generator, n: int) -> np.ndarray:
    # a user message: median 150 tokens, long tail (pasted text)
    return np.clip(np.rint(rng.lognormal(np.log(150.0), 0.8, n)), 1, 4096)


def _default_output_tokens(rng: np.random.Generator, n: int) -> np.ndarray:
    # a chat reply: median 250 tokens
    return np.clip(np.rint(rng.lognormal(np.log(250.0), 0.7, n)), 1, 2048)


def _draw(spec: int | ArrayLike | Sampler, rng: np.random.Generator, n: int,
          what: str) -> np.ndarray:
    values = spec(rng, n) if callable(spec) else np.broadcast_to(np.asarray(spec), (n,))
    values = np.asarray(values).reshape(-1)
    if values.size != n:
        raise ValueError(f"{what}: got {values.size} values, expected {n}")
    if values.dtype.kind not in "iuf" or np.any(values != np.floor(values)) or np.any(values < 1):
        raise ValueError(f"{what}: expected integers >= 1")
    return values.astype(np.int64)


def _turn_counts(turns: int | float | tuple[int, int], rng: np.random.Generator,
                 n: int) -> np.ndarray:
    if isinstance(turns, tuple):
        lo, hi = turns
        if not 1 <= lo <= hi:
            raise ValueError(f"turns is {turns}; expected (min, max) with 1 <= min <= max")
        return rng.integers(lo, hi + 1, n)
    if not turns >= 1 or not math.isfinite(turns):
        raise ValueError(f"turns is {turns}; expected a mean >= 1 or a (min, max) pair")
    return rng.geometric(1.0 / turns, n)  # support 1, 2, ...; mean ``turns``


def synthetic_sessions(
    num_sessions: int = 200,
    *,
    turns: int | float | tuple[int, int] = (2, 8),
    system_prompt_tokens: int | Sequence[int] = 1024,
    num_system_prompts: int = 4,
    user_tokens: int | ArrayLike | Sampler = _default_user_tokens,
    output_tokens: int | ArrayLike | Sampler = _default_output_tokens,
    think_time_s: float = 10.0,
    session_rate: float = 0.2,
    block_tokens: int = 16,
    nominal_tpot_s: float = 0.02,
    seed: int = 0,
    name: str | None = None,
) -> Trace:
    """Multi-turn chat sessions whose prompts grow by the conversation so far.

    Session s picks one of ``num_system_prompts`` shared system prompts (uniformly). Its
    turn-k prompt is the system prompt, then every earlier user message and response, then the
    turn's user message: prompt_k = prompt_{k-1} + output_{k-1} + user_k tokens, so turn k-1's
    prompt and response are a cached prefix of turn k.

    Block ids (``B = block_tokens``) say exactly which blocks hold the same tokens: a full block
    lying wholly inside the system prompt is keyed by (system prompt, block index) and is shared
    by every session with that system prompt; any other full block is keyed by (session, block
    index), shared by the session's later turns (their prompts extend this one); a partial last
    block gets a fresh id (its tokens continue differently in the next turn). Blocks that cover
    turn k-1's response appear only in turn k's and later ids.

    Arrivals (open loop): sessions start as a Poisson process at ``session_rate`` per second
    (the first at 0); turn k arrives ``nominal_tpot_s * output_{k-1} + think_{k}`` after turn
    k-1, i.e. after a nominal service time (decode at ``nominal_tpot_s`` s per token, prefill
    and queueing ignored) and the think time. Closed-loop replay should ignore these and use
    ``prev`` and ``think_time_s`` (exponential, mean ``think_time_s``; 0 for first turns).

    Random draws use separate streams spawned from ``seed`` (structure, lengths, think times,
    session starts), so changing ``session_rate``, ``think_time_s`` or ``nominal_tpot_s``
    keeps the same requests and ids.

    Args:
        num_sessions: number of sessions, >= 1.
        turns: turns per session: ``(min, max)`` uniform inclusive, or a mean (geometric on
            1, 2, ...).
        system_prompt_tokens: length of every system prompt, or one length per system prompt
            (>= 0; 0: none).
        num_system_prompts: how many distinct system prompts the sessions draw from, >= 1.
        user_tokens: each user message's length: a constant, an array (one per request in
            (session, turn) order) or a sampler ``f(rng, n)``; integers >= 1.
        output_tokens: each response's length, the same forms.
        think_time_s: mean think time between a response and the next turn, >= 0.
        session_rate: session starts per second, > 0.
        block_tokens: tokens per hash block ``B``, >= 1.
        nominal_tpot_s: seconds per output token in the open-loop arrival estimate, >= 0.
        seed: makes the trace reproducible.
        name: the trace name; default ``"synthetic-sessions(n=..,B=..,seed=..)"``.

    Returns:
        A trace with the session extras (module docstring) plus ``system_prompt`` (int64, the
        system prompt's index) and ``user_tokens`` (int64, the turn's new user message).
    """
    if num_sessions < 1:
        raise ValueError(f"num_sessions is {num_sessions}; expected >= 1")
    if num_system_prompts < 1:
        raise ValueError(f"num_system_prompts is {num_system_prompts}; expected >= 1")
    if block_tokens < 1:
        raise ValueError(f"block_tokens is {block_tokens}; expected >= 1")
    for label, value in (("think_time_s", think_time_s), ("nominal_tpot_s", nominal_tpot_s)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{label} is {value}; expected a finite number >= 0")
    if not math.isfinite(session_rate) or session_rate <= 0:
        raise ValueError(f"session_rate is {session_rate}; expected a finite rate > 0")
    sys_len = np.broadcast_to(np.asarray(system_prompt_tokens, np.int64),
                              (num_system_prompts,)).copy()
    if np.any(sys_len < 0):
        raise ValueError(f"system_prompt_tokens is {system_prompt_tokens}; expected >= 0")
    structure, lengths, thinking, starts = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4))
    count = _turn_counts(turns, structure, num_sessions).astype(np.int64)
    system = structure.integers(0, num_system_prompts, num_sessions).astype(np.int64)
    n = int(count.sum())
    user = _draw(user_tokens, lengths, n, "user_tokens")
    output = _draw(output_tokens, lengths, n, "output_tokens")
    session = np.repeat(np.arange(num_sessions, dtype=np.int64), count)
    first = np.concatenate(([0], np.cumsum(count)[:-1]))
    turn = np.arange(n, dtype=np.int64) - np.repeat(first, count)
    # prompt_k = system + sum(user_0..k) + sum(output_0..k-1), per session
    grow = user + np.where(turn > 0, np.roll(output, 1), 0)
    prompt = sys_len[system][session] + _per_session_cumsum(grow, first, count)
    think = np.where(turn > 0, thinking.exponential(think_time_s, n) if think_time_s else 0.0,
                     0.0)
    start = np.concatenate(([0.0], np.cumsum(starts.exponential(1 / session_rate,
                                                                 num_sessions - 1))))
    step = np.where(turn > 0, nominal_tpot_s * np.roll(output, 1) + think, 0.0)
    arrival = start[session] + _per_session_cumsum(step, first, count)
    ids = _synthetic_ids(prompt, session, system, sys_len, count, block_tokens)
    columns = {
        "hash_block_tokens": np.full(n, block_tokens, np.int64),
        "session": session,
        "turn": turn,
        "think_time_s": think.astype(np.float64),
        "system_prompt": system[session],
        "user_tokens": user,
    }
    name = name or f"synthetic-sessions(n={num_sessions},B={block_tokens},seed={seed})"
    return _sessions_trace(arrival, prompt, output, ids, columns, name)


def _per_session_cumsum(values: np.ndarray, first: np.ndarray, count: np.ndarray) -> np.ndarray:
    total = np.cumsum(values)
    before = np.where(first > 0, total[np.maximum(first - 1, 0)], 0)
    return total - np.repeat(before, count)


def _synthetic_ids(prompt: np.ndarray, session: np.ndarray, system: np.ndarray,
                   sys_len: np.ndarray, count: np.ndarray, block: int) -> list[tuple[int, ...]]:
    """Ids by formula (a dict over every block would be slow): system prompt p's full blocks
    are ``sys_base[p] + j``; session s's other full blocks ``sess_base[s] + j - F``, with F
    the system prompt's full blocks (a session's last prompt is its longest, so its range
    covers every turn); then one fresh id per partial last block."""
    sys_full = sys_len // block
    sys_base = np.concatenate(([0], np.cumsum(sys_full)))[:-1]
    last = np.cumsum(count) - 1
    own = prompt[last] // block - sys_full[system]
    sess_base = int(sys_full.sum()) + np.concatenate(([0], np.cumsum(own)))[:-1]
    fresh = int(sys_full.sum() + own.sum())
    out: list[tuple[int, ...]] = []
    for r in range(prompt.size):
        s = int(session[r])
        p = int(system[s])
        full, f = int(prompt[r] // block), int(sys_full[p])
        row = list(range(int(sys_base[p]), int(sys_base[p]) + f))
        row += range(int(sess_base[s]), int(sess_base[s]) + full - f)
        if prompt[r] % block:
            row.append(fresh)
            fresh += 1
        out.append(tuple(row))
    return out
