"""The environment's views: text (``render_mode="ansi"``) and a picture (``"rgb_array"``).

``render_rgb`` draws a fixed (96, 192, 3) uint8 frame with numpy slicing only (about
50 us; no plotting library), the same shape before ``reset``, mid-episode and after the
episode ended. Token bars are log-scaled: ``log1p(tokens) / log1p(TOKEN_SCALE)`` of the panel
width (2**17 tokens fill it). Rows and columns are pixels, top left (0, 0):

| rows  | columns | shows                                                                     |
|-------|---------|---------------------------------------------------------------------------|
| 0-7   | 0-159   | KV blocks in use (fraction): green, amber from 90%; grey track            |
| 0-7   | 164-191 | KV shortfall of the pending iteration: red when blocks are missing        |
| 10-89 | 0-93    | visible waiting slots, top down: prompt tokens; blue, orange if preempted |
| 10-89 | 98-191  | visible running slots: upper half dim cyan = tokens (prompt + generated), |
|       |         | bright cyan = the computed part of them; lower half lime = generated      |
| 92-95 | 0-191   | the episode's requests: finished (white), then shed (red); grey = rest    |

Slot i of a panel is always at the same place: ``80 // K`` (waiting) or ``80 // R`` (running)
rows high, at least 1, with a 1-row gap below slots of 3 rows or more (defaults K=16, R=32: 4
bar rows + gap, 2 bar rows). Slots past row 89 are not drawn; running slots of 1 row show no
generated part. Before ``reset`` the frame shows the empty tracks; after the episode ended,
the final KV and progress strips over empty panels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from cbgym.env.scheduling_env import SchedulingEnv


def render_text(env: SchedulingEnv) -> str:
    """The ``ansi`` view: the clock, KV usage, and the visible queue and batch."""
    eng, dp = env.engine, env.decision_point
    kv = eng.kv
    head = (f"t={eng.now:9.3f}s  iteration {eng.iteration}  step {env._steps}  "
            f"KV {kv.used}/{kv.num_blocks} blocks ({100 * kv.usage:5.1f}%)  "
            f"preemptions {eng.total_preemptions}  finished {eng.req.num_finished}"
            f"/{eng.req.n}")
    if dp is None:
        return head + "\n(drained)\n"
    short = f"  SHORTFALL {dp.shortfall_blocks} blocks" if dp.shortfall_blocks else ""
    w_ids, r_ids = env.visible_waiting_ids, env.visible_running_ids
    lines = [head, f"waiting {len(dp.waiting)} ({len(w_ids)} visible){short}"]
    cols = "  slot      id  prompt  computed  generated  in_sys_s  preempt"
    for title, ids in (("waiting", w_ids), ("running", r_ids)):
        lines.append(f"{title}:{cols}")
        for slot, rid in enumerate(ids.tolist()):
            lines.append(
                f"{'':8}{slot:6d}{rid:8d}{int(dp.prompt_tokens[rid]):8d}"
                f"{int(dp.num_computed[rid]):10d}{int(dp.num_generated[rid]):11d}"
                f"{dp.now - dp.arrival_s[rid]:10.3f}{int(dp.num_preemptions[rid]):9d}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- rgb_array
H, W = 96, 192
RGB_SHAPE = (H, W, 3)
TOKEN_SCALE = 2**17  # tokens that fill a whole bar (the bars are log-scaled)
_TOP, _PH, _PW = 10, 80, 94  # first panel row, panel height and width
_WX, _RX = 0, 98  # left edge of the waiting and of the running panel


def _rgb(r: int, g: int, b: int) -> np.ndarray:
    return np.array((r, g, b), np.uint8)


_GREEN, _AMBER, _RED = _rgb(60, 200, 80), _rgb(240, 170, 40), _rgb(230, 40, 40)
_WHITE, _BLUE, _ORANGE = _rgb(220, 220, 220), _rgb(70, 130, 230), _rgb(240, 140, 40)
_DIM_CYAN, _CYAN, _LIME = _rgb(30, 80, 90), _rgb(60, 210, 230), _rgb(150, 230, 90)
_EMPTY = np.full(RGB_SHAPE, 16, np.uint8)  # background, with grey tracks under the strips
_EMPTY[0:8, 0:160] = _EMPTY[0:8, 164:W] = _EMPTY[92:H, :] = 48


def _log_px(tokens: np.ndarray) -> list[int]:
    """Bar lengths in pixels: log1p(tokens) relative to log1p(TOKEN_SCALE), clipped."""
    frac = np.log1p(tokens.astype(np.float64)) / np.log1p(TOKEN_SCALE)
    return np.rint(np.clip(frac, 0.0, 1.0) * _PW).astype(np.int64).tolist()


def _slots(num_slots: int, ids: np.ndarray) -> tuple[int, int, np.ndarray]:
    """A panel of ``num_slots`` slots: rows per slot, bar rows, and the ids drawn.

    Slot i is ``_PH // num_slots`` rows high (at least 1, a 1-row gap below from 3 rows on),
    at the same place every frame; slots past the panel's height are not drawn."""
    h = max(1, _PH // num_slots)
    return h, h - 1 if h >= 3 else h, ids[:_PH // h]


def render_rgb(env: SchedulingEnv) -> np.ndarray:
    """The ``rgb_array`` view: a (96, 192, 3) uint8 picture (layout in the module docstring)."""
    frame = _EMPTY.copy()
    sim = env._sim
    if sim is None:  # before reset: the empty tracks
        return frame
    eng = sim.engine
    req, usage = eng.req, eng.kv.usage
    frame[0:8, 0:round(160 * min(max(usage, 0.0), 1.0))] = _AMBER if usage >= 0.9 else _GREEN
    if sim.shortfall > 0:
        frame[0:8, 164:W] = _RED
    frame[92:H, 0:round(W * req.num_ended / req.n)] = _RED  # shed, then drawn over by finished
    frame[92:H, 0:round(W * req.num_finished / req.n)] = _WHITE
    h, bar, ids = _slots(env.K, sim.w_ids)
    if len(ids):
        pre = (req.preemptions[ids] > 0).tolist()
        for i, (px, p) in enumerate(zip(_log_px(req.prompt[ids]), pre, strict=True)):
            y = _TOP + i * h
            frame[y:y + bar, _WX:_WX + px] = _ORANGE if p else _BLUE
    h, bar, ids = _slots(env.R, sim.r_ids)
    if len(ids):
        tokens = req.tokens[ids]
        tok_px = _log_px(tokens)
        done = (req.computed[ids] / np.maximum(tokens, 1)).tolist()
        up = bar - bar // 2  # upper rows: tokens and computed; lower rows: generated
        for i, (tp, d, gp) in enumerate(zip(tok_px, done, _log_px(req.generated[ids]),
                                            strict=True)):
            y = _TOP + i * h
            frame[y:y + up, _RX:_RX + tp] = _DIM_CYAN
            frame[y:y + up, _RX:_RX + round(tp * d)] = _CYAN
            frame[y + up:y + bar, _RX:_RX + gp] = _LIME
    return frame
