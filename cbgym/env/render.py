"""The environment's text view (``render_mode="ansi"``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

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
