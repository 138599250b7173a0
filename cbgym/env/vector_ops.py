"""The batched env step, compiled: N episodes advanced in one call, threads over envs.

Each env of a :class:`~cbgym.env.vector.SchedulingVectorEnv` owns row i of every batched
array (the engine's :class:`~cbgym.engine.layout.State` and the env's
:class:`~cbgym.env.kernel_state.EnvState` with a leading env dimension). :func:`step_batch`
takes env i's views and runs exactly what one :class:`~cbgym.env.SchedulingEnv` step runs
(the same kernels, in the same order), so env i's trajectory is bit for bit that of a single
env: numba's threads only decide which core runs which env.

An episode starts inside the kernel too (:func:`start_episode`): the window's requests are
copied from the base trace, their arrivals rebased and scaled to the drawn load exactly as
:meth:`cbgym.Trace.window` and :func:`cbgym.capacity.scale_to_load` compute them, and the
engine advances to the first decision point. Window starts and loads are drawn in Python
from each env's own generator, one episode ahead (:class:`Windows`), in the single env's
order, so draws never depend on threads.

The time series is not kept (a vector env serves training): a full buffer is emptied in
place, keeping its open row as the engine's recorder does, and the run goes on.
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

from cbgym.engine import layout as L
from cbgym.engine import prefix_cache as pc
from cbgym.engine.jit import frozen, kernel, parallel_kernel
from cbgym.engine.layout import Params, State, fill_state
from cbgym.engine.loop import advance
from cbgym.env import kernel_ops as ko
from cbgym.env import micro_ops as mo
from cbgym.env.kernel_ops import EnvState

# v: per-env counters (int64)
(STEPS, LAST_ITER, ENDED, STUCK, DRAINED, WANTS_WINDOW, SHED_AT_START,
 NO_WINDOW) = L._codes(8)
NUM_V = 8
# info_i columns: what a step produced (int64)
(I_FINISHED, I_GOOD, I_SHED, I_ITERATIONS, I_STUCK, I_TERMINATED, I_TRUNCATED,
 I_INVALID) = L._codes(8)
NUM_I = 8
# info_f columns (float64): the reward's components, the clock, the step's simulated time
F_REWARD, F_GOODPUT, F_TTFT_MISS, F_SHED, F_LATENCY, F_NOW, F_ELAPSED = L._codes(7)
NUM_F = 7


class Base(NamedTuple):
    """The trace episodes are drawn from (read only): per request, and the capacity."""

    arrival: np.ndarray  # seconds, as the trace has them
    prompt: np.ndarray
    output: np.ndarray
    ttft: np.ndarray  # SLO targets per request
    tpot: np.ndarray
    template: np.ndarray  # (n, F) static slot features (observation.slot_template)
    mu: np.ndarray  # (1,) the capacity load is relative to (requests/s)
    # with prefix caching: every request's block hashes (prefix_hashes.block_hashes of the
    # whole trace) and where each request's start, n + 1 entries (prefix_cache.table_offsets);
    # without, one zero each
    hashes: np.ndarray
    hash_off: np.ndarray


_INT_COLUMNS = ("prompt", "output", "hashes", "hash_off")


def frozen_base(b: Base) -> Base:
    """``b`` with every column read-only (one type for the kernels, see ``jit.frozen``)."""
    return Base(*(frozen(a, np.int64 if k in _INT_COLUMNS else np.float64)
                  for k, a in zip(Base._fields, b, strict=True)))


class Windows(NamedTuple):
    """Each env's next episode: its first request and load (NaN: the trace's clock)."""

    start: np.ndarray  # (N,) int64
    load: np.ndarray  # (N,) float64


class Acts(NamedTuple):
    """The step's actions and the masked variant's micro-step state, one row per env."""

    scores: np.ndarray  # (N, K + R [+ 1]) float64: Scheduling-v0's actions
    picks: np.ndarray  # (N,) int64: SchedulingMasked-v0's actions
    m: np.ndarray  # (N, micro_ops.micro_size) int64: the choices made at the point
    mask: np.ndarray  # (N, K + R + 1) int8: the allowed picks
    mode: np.ndarray  # (2,) int64: [masked, on a masked pick: 1 = STOP, 0 = no-op]


class Out(NamedTuple):
    """What a batched step writes, one row per env (observation, reward, flags, info).

    ``obs`` holds the observation flat, its keys in ``gymnasium.spaces.flatten``'s order
    (global, running, running_mask, waiting, waiting_mask); the Dict view slices it.
    """

    obs: np.ndarray  # (N, D) float32
    waited: np.ndarray  # (N, K) float64 exact waiting seconds
    info_i: np.ndarray  # (NUM_I, N) int64: counts and flags by I_ name, env by column
    info_f: np.ndarray  # (NUM_F, N) float64: reward, its components, clock


def obs_slices(K: int, R: int) -> dict[str, slice]:
    """Where each observation key lives in ``Out.obs`` (spaces.flatten's order)."""
    sizes = {"global": ko.G, "running": R * ko.F, "running_mask": R,
             "waiting": K * ko.F, "waiting_mask": K}
    out, at = {}, 0
    for key, size in sizes.items():
        out[key] = slice(at, at + size)
        at += size
    return out


@kernel
def engine_at(S: State, i: int) -> State:
    """Env i's engine state (views into the batched arrays)."""
    return State(S.req[i], S.times[i], S.ids[i], S.si[i], S.sf[i], S.rec[i], S.blog[i],
                 S.plog[i], S.slots[i], S.gaps[i], S.blocks[i], S.cache[i], S.tables[i])


@kernel
def env_at(E: EnvState, i: int) -> EnvState:
    """Env i's env state (the settings are shared)."""
    return EnvState(E.cfg_i, E.cfg_f, E.targets[i], E.arr_prefix[i], E.order[i],
                    E.template[i], E.acc_i[i], E.acc_f[i], E.win[i])


@kernel
def empty_buffers(s: State) -> None:
    """Make room in a full time-series buffer, keeping the open row (Recorder.flush)."""
    n = s.si[L.REC_N]
    if n > 1:
        for c in range(s.rec.shape[1]):
            s.rec[0, c] = s.rec[n - 1, c]
        s.si[L.REC_N] = 1


@kernel
def settle(s: State, p: Params, code: int) -> int:
    """Advance on through full buffers (Engine.settle without the Python recorder)."""
    while code == L.NEED_ROOM:
        empty_buffers(s)
        code = advance(s, p)
    return code


@kernel
def write_obs(out: Out, i: int, obs: tuple, K: int, R: int) -> None:
    """Env i's observation (the encoder's arrays) into row i, in obs_slices' order."""
    g, w, wm, r, rm, waited = obs
    row, at = out.obs[i], 0
    for part in (g, r, rm, w, wm):
        for j in range(len(part)):
            row[at + j] = part[j]
        at += len(part)
    for j in range(K):
        out.waited[i, j] = waited[j]


@kernel
def write_outcome(out: Out, i: int, outcome: np.ndarray, weights: np.ndarray,
                  iterations: int) -> None:
    """The step's reward and info from the reward kernel's outcome (StepOutcome, combine)."""
    good, finished, shed, misses = outcome[0], outcome[1], outcome[2], outcome[3]
    latency, elapsed = outcome[4], outcome[5]
    ttft_miss, shed_c, latency_c = 0.0 - misses, 0.0 - shed, 0.0 - latency
    out.info_f[F_REWARD, i] = (good + weights[0] * ttft_miss + weights[1] * shed_c
                               + weights[2] * latency_c)
    out.info_i[I_FINISHED, i], out.info_i[I_GOOD, i] = np.int64(finished), np.int64(good)
    out.info_i[I_SHED, i], out.info_i[I_ITERATIONS, i] = np.int64(shed), iterations
    out.info_f[F_GOODPUT, i], out.info_f[F_TTFT_MISS, i] = good, ttft_miss
    out.info_f[F_SHED, i], out.info_f[F_LATENCY, i] = shed_c, latency_c
    out.info_f[F_ELAPSED, i] = elapsed


@kernel
def clear_outcome(out: Out, i: int) -> None:
    for c in range(NUM_I):
        out.info_i[c, i] = 0
    for c in range(NUM_F):
        out.info_f[c, i] = 0.0


@kernel
def start_episode(s: State, p: Params, e: EnvState, v: np.ndarray, base: Base, start: int,
                  load: float, n: int, host_free: int, scratch: np.ndarray, m: np.ndarray,
                  mask: np.ndarray) -> tuple:
    """Start env's next episode on requests [start, start + n) of the base trace, at
    ``load`` (NaN: unscaled), and advance to its first decision point. The observation."""
    b = base.arrival
    a0 = b[start] - b[start]  # Trace.window rebases to its first arrival: 0.0
    factor = 1.0
    if not np.isnan(load):  # scale_to_load: n requests over n / (rho * mu) seconds
        span = n / (load * base.mu[0])
        factor = span / ((b[start + n - 1] - b[start]) - a0)
    for j in range(n):
        x = b[start + j] - b[start]
        scratch[j] = (x - a0) * factor if not np.isnan(load) else x
    arrival = scratch[:n]
    fill_state(s, arrival, base.prompt[start:start + n], base.output[start:start + n],
               p.ci[L.NUM_BLOCKS], host_free, False)  # (no p99 gaps: SchedulingEnv's)
    if p.ci[L.PREFIX]:  # the window's slice of the whole trace's hashes and tables
        off = base.hash_off
        pc.reset_pool(s, p.ci[L.NUM_BLOCKS], off[start:start + n + 1],
                      base.hashes[off[start]:off[start + n]])
    ko.fill_env_state(e, arrival, base.ttft[start:start + n], base.tpot[start:start + n],
                      base.template[start:start + n])
    code = settle(s, p, advance(s, p))
    drained = code == L.DRAINED
    if not drained:
        ko.visible(s, e)
    v[SHED_AT_START] = ko.account_sheds(s, e)
    v[STEPS], v[LAST_ITER], v[ENDED], v[STUCK] = 0, 0, 0, 0
    v[DRAINED], v[WANTS_WINDOW] = drained, 1
    mo.begin_point(e, m, mask, drained)
    none = np.empty(0, np.int64)
    return ko.observe(s, e, drained, none, none)


@kernel
def finish_run(s: State, p: Params, e: EnvState, v: np.ndarray, out: Out, i: int,
               weights: np.ndarray, code: int, obs: tuple, outcome: np.ndarray) -> None:
    """After a decision ran (Episode._settle): settle the engine, score, observe."""
    if code != L.AT_DECISION and code != L.DRAINED:
        code = settle(s, p, code)
        if code == L.TOO_MANY_IDLE_TICKS:
            v[STUCK] = 1
            out.info_i[I_STUCK, i] = 1
        obs, outcome = ko.finish_step(s, e, code == L.DRAINED)
    v[DRAINED] = code == L.DRAINED
    iteration = s.si[L.ITERATION]
    write_outcome(out, i, outcome, weights, iteration - v[LAST_ITER])
    v[LAST_ITER] = iteration
    write_obs(out, i, obs, e.cfg_i[ko.K_SLOTS], e.cfg_i[ko.R_SLOTS])


@kernel
def step_env(s: State, p: Params, e: EnvState, v: np.ndarray, acts: Acts, out: Out, i: int,
             weights: np.ndarray, max_steps: int) -> None:
    """One step of env i: SchedulingEnv.step on validated scores, or SchedulingMaskedEnv's
    micro-step on a pick (a masked pick acts as STOP or as a no-op, by ``acts.mode``)."""
    K, R = e.cfg_i[ko.K_SLOTS], e.cfg_i[ko.R_SLOTS]
    m, mask = acts.m[i], acts.mask[i]
    clear_outcome(out, i)
    if v[DRAINED]:  # every request ended before the first decision: nothing to act on
        none = np.empty(0, np.int64)
        write_obs(out, i, ko.observe(s, e, L.YES, none, none), K, R)
        out.info_i[I_TERMINATED, i] = True
        if acts.mode[0] and acts.picks[i] != K + R:
            out.info_i[I_INVALID, i] = 1
    elif not acts.mode[0]:
        code, obs, outcome = ko.step_scores(s, p, e, acts.scores[i])
        finish_run(s, p, e, v, out, i, weights, code, obs, outcome)
    else:
        pick = mo.choose(s, e, m, mask, acts.picks[i])
        if pick == mo.MASKED:
            out.info_i[I_INVALID, i] = 1
            pick = mo.READY if acts.mode[1] else mo.MORE
        if pick == mo.MORE:
            write_obs(out, i, mo.observe_point(s, e, m), K, R)
        else:
            code, obs, outcome = mo.run_point(s, p, e, m)
            finish_run(s, p, e, v, out, i, weights, code, obs, outcome)
            mo.begin_point(e, m, mask, v[DRAINED] != 0 or v[STUCK] != 0)
    out.info_i[I_TERMINATED, i] = v[DRAINED] != 0
    v[STEPS] += 1
    out.info_i[I_TRUNCATED, i] = not out.info_i[I_TERMINATED, i] and (
        v[STUCK] != 0 or (max_steps >= 0 and v[STEPS] >= max_steps))
    out.info_f[F_NOW, i] = s.sf[L.NOW]
    v[ENDED] = out.info_i[I_TERMINATED, i] or out.info_i[I_TRUNCATED, i]
    if v[ENDED]:
        mo.begin_point(e, m, mask, L.YES)  # STOP only until the next episode


@kernel
def begin(S: State, p: Params, E: EnvState, V: np.ndarray, base: Base, win: Windows,
          acts: Acts, out: Out, i: int, n: int, host_free: int, scratch: np.ndarray) -> None:
    """Env i starts its drawn window; row i gets the reset's observation and info. A window
    in error (start -1: it cannot be scaled to its load) starts nothing: Python raises."""
    if win.start[i] < 0:
        V[i, NO_WINDOW] = 1
        return
    s, e = engine_at(S, i), env_at(E, i)
    obs = start_episode(s, p, e, V[i], base, win.start[i], win.load[i], n, host_free,
                        scratch[i], acts.m[i], acts.mask[i])
    write_obs(out, i, obs, E.cfg_i[ko.K_SLOTS], E.cfg_i[ko.R_SLOTS])
    clear_outcome(out, i)
    out.info_i[I_SHED, i] = V[i, SHED_AT_START]
    out.info_f[F_NOW, i] = s.sf[L.NOW]


@kernel
def begin_again(S: State, p: Params, E: EnvState, V: np.ndarray, base: Base, win: Windows,
                acts: Acts, out: Out, final: Out, i: int, n: int, host_free: int,
                scratch: np.ndarray) -> None:
    """Same-step autoreset of env i: its ending step moves to ``final`` and the next episode
    begins; the reward and flags in ``out`` stay the ending step's.

    (Kept out of step_batch's prange body: there, numba's parallel transform lost the
    restored flags, while the same code compiled serially kept them.)
    """
    copy_row(out, final, i)
    begin(S, p, E, V, base, win, acts, out, i, n, host_free, scratch)
    out.info_f[F_REWARD, i] = final.info_f[F_REWARD, i]
    out.info_i[I_TERMINATED, i] = final.info_i[I_TERMINATED, i]
    out.info_i[I_TRUNCATED, i] = final.info_i[I_TRUNCATED, i]


@kernel
def reset_batch(S: State, p: Params, E: EnvState, V: np.ndarray, base: Base, win: Windows,
                acts: Acts, out: Out, which: np.ndarray, n: int, host_free: int,
                scratch: np.ndarray) -> None:
    """Start a new episode in every env with ``which[i]`` (its drawn window). Serial: a
    reset of every env is rare (autoresets run in step_batch), and numba's parallel build
    of this loop took 10 s of the vector env's first compile."""
    for i in range(len(which)):
        if which[i]:
            begin(S, p, E, V, base, win, acts, out, i, n, host_free, scratch)


@kernel
def first_invalid(actions: np.ndarray, skip: np.ndarray) -> int:
    """The flat index of the first score outside [-1, 1] (or NaN) in a row not skipped (an
    env about to reset ignores its action); -1 if none."""
    n, size = actions.shape
    for i in range(n):
        if skip[i]:
            continue
        for j in range(size):
            if not -1.0 <= actions[i, j] <= 1.0:
                return i * size + j
    return -1


@parallel_kernel
def step_batch(S: State, p: Params, E: EnvState, V: np.ndarray, base: Base, win: Windows,
               acts: Acts, out: Out, final: Out, reset: np.ndarray,
               same_step: bool, weights: np.ndarray, max_steps: int, n: int,
               host_free: int, scratch: np.ndarray) -> int:
    """Step every env: those in ``reset`` start their next episode instead (next-step
    autoreset); with ``same_step``, an env whose episode ends has its last observation and
    outcome copied to ``final`` and starts the next one in the same call (its reward and
    flags stay the ending step's; its observation and info become the reset's).

    Returns how many envs started an episode (their next windows are to be drawn), or
    ``-1 - j`` with nothing done when the score at flat index j is invalid.
    """
    if not acts.mode[0]:
        bad = first_invalid(acts.scores, reset)
        if bad >= 0:
            return -1 - bad
    for j in numba.prange(len(reset)):
        i = np.int64(j)  # (prange's index is uint64 in the parallel body: one type, one build)
        if reset[i]:
            begin(S, p, E, V, base, win, acts, out, i, n, host_free, scratch)
        else:
            step_env(engine_at(S, i), p, env_at(E, i), V[i], acts, out, i, weights, max_steps)
            if same_step and V[i, ENDED]:
                begin_again(S, p, E, V, base, win, acts, out, final, i, n, host_free,
                            scratch)
    started = 0  # envs whose next window is to be drawn, or whose window was in error
    for i in range(len(reset)):
        started += V[i, WANTS_WINDOW] + V[i, NO_WINDOW]
    return started


@kernel
def copy_row(src: Out, dst: Out, i: int) -> None:
    dst.obs[i, :] = src.obs[i]
    dst.waited[i, :] = src.waited[i]
    for c in range(NUM_I):
        dst.info_i[c, i] = src.info_i[c, i]
    for c in range(NUM_F):
        dst.info_f[c, i] = src.info_f[c, i]
