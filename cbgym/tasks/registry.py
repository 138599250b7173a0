"""Named benchmark tasks: everything an experiment fixes, and disjoint train / test windows.

A :class:`Task` fixes the trace, the window size, the training load (or load range) and the
test load, the engine preset, the SLO and the env's observation and action settings. Its
requests are split by time into disjoint ranges: training windows are drawn from the first
range, validation from the second, and the test windows (evenly spaced in the last range)
are never used for training or tuning.

Each task is also an env id, ``cbgym/Scheduling-<name>-v0`` (and ``SchedulingMasked``), that
``gym.make`` and ``gym.make_vec`` build with no arguments; the trace is loaded when the env is
made (``CBGYM_TRACE_DIR`` or the user cache), not at import.

| task | trace | engine | train load | test load | SLO (TTFT / TPOT) |
|---|---|---|---|---|---|
| conv-study-overload | azure-conv-2023 | cbsjf-paper | 1.3-1.9 | 1.6 | 2 s / 0.1 s |
| code-vllm-overload | azure-code-2023 | llama-2-7b/a100-80gb | 1.1-1.5 | 1.3 | 5 s / 0.2 s |

``conv-study-overload``: the CB-SJF-Work study's engine far past saturation; its test load was
chosen on the validation windows (the smallest of 1.3, 1.6, 2.0 at which random actions reach
at most 80% of the best reference's goodput). ``code-vllm-overload``: the same rule on the
code trace and the realistic engine; at 2 s / 0.1 s (or 0.5 s / 0.05 s) under 2% of code
requests meet their SLO whatever the policy, so its targets are 5 s / 0.2 s (of 5 / 0.2 and
10 / 0.5 s, the tighter one at which random actions stay under 80% of the best; validation:
0.82 at rho 1.0, 0.55 at 1.3). docs/benchmark.md has the measured baselines.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from cbgym.metrics import SLO

__all__ = ["TASKS", "Task", "get"]


@dataclass(frozen=True)
class Task:
    """One benchmark task (see the module docstring).

    Attributes:
        splits: (a, b): training windows lie in the first fraction a of the trace's requests,
            validation in [a, b), test in [b, 1).
        env: further :class:`cbgym.env.SchedulingEnv` arguments (K, R, thresholds, ...).
    """

    name: str
    summary: str
    trace: str
    engine: str
    train_load: float | tuple[float, float]
    test_load: float
    slo: SLO
    episode_requests: int = 512
    splits: tuple[float, float] = (0.6, 0.7)
    test_windows: int = 8
    env: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        a, b = self.splits
        if not 0 < a < b < 1:
            raise ValueError(f"task {self.name!r}: splits={self.splits!r}: expected 0 < a < b < 1")
        if self.test_windows < 1 or self.episode_requests < 2:
            raise ValueError(f"task {self.name!r}: test_windows >= 1 and episode_requests >= 2")

    @property
    def env_id(self) -> str:
        return f"cbgym/Scheduling-{self.name}-v0"

    @property
    def masked_env_id(self) -> str:
        return f"cbgym/SchedulingMasked-{self.name}-v0"

    def ranges(self, num_requests: int) -> dict[str, tuple[int, int]]:
        """The request ranges [lo, hi) of the train, validation and test splits."""
        a, b = (int(num_requests * x) for x in self.splits)
        return {"train": (0, a), "validation": (a, b), "test": (b, num_requests)}

    def starts(self, num_requests: int, split: str = "test") -> list[int]:
        """``test_windows`` evenly spaced window starts lying wholly inside ``split``."""
        lo, hi = self.ranges(num_requests)[split]
        last = hi - self.episode_requests
        if last < lo:
            raise ValueError(f"task {self.name!r}: the {split} range [{lo}, {hi}) cannot hold a "
                             f"{self.episode_requests}-request window")
        return [int(x) for x in np.linspace(lo, last, self.test_windows).round()]

    def env_kwargs(self, num_requests: int, split: str = "train") -> dict[str, Any]:
        """``SchedulingEnv`` arguments for episodes drawn from ``split`` (the train load for
        training, the test load otherwise)."""
        from cbgym.engine.config import EngineConfig

        return {"trace": self.trace, "engine": EngineConfig(preset=self.engine),
                "load": self.train_load if split == "train" else self.test_load,
                "slo": self.slo, "episode_requests": self.episode_requests,
                "window_start_range": self.ranges(num_requests)[split], **self.env}


TASKS: Mapping[str, Task] = MappingProxyType({task.name: task for task in (
    Task("conv-study-overload",
         "Conversation requests on the CB-SJF-Work study's engine past saturation: the "
         "admission order (and dropping requests already late) decides the goodput.",
         trace="azure-conv-2023", engine="cbsjf-paper", train_load=(1.3, 1.9),
         test_load=1.6, slo=SLO(ttft_s=2.0, tpot_s=0.1)),
    Task("code-vllm-overload",
         "Code requests (long prompts) on a vLLM-style engine (chunked prefill, paged KV "
         "cache) past saturation, with targets long prompts can meet.",
         trace="azure-code-2023", engine="llama-2-7b/a100-80gb", train_load=(1.1, 1.5),
         test_load=1.3, slo=SLO(ttft_s=5.0, tpot_s=0.2)),
)})


def get(name: str) -> Task:
    """The task called ``name``; a ValueError lists the known ones."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; known: {', '.join(sorted(TASKS))}") from None


def _num_requests(task: Task) -> int:
    from cbgym.workload import load_trace

    return len(load_trace(task.trace))


def make_env(task: str, masked: bool = False, **overrides: Any) -> Any:
    """The task's training env (the entry point of its env ids); ``overrides`` replace any
    argument (e.g. ``render_mode``)."""
    from cbgym.env.scheduling_env import SchedulingEnv, SchedulingMaskedEnv

    t = get(task)
    kwargs = {**t.env_kwargs(_num_requests(t)), **overrides}
    return SchedulingMaskedEnv(**kwargs) if masked else SchedulingEnv(**kwargs)


def make_vector_env(num_envs: int = 1, task: str = "", masked: bool = False,
                    **overrides: Any) -> Any:
    """The task's native vector env (the vector entry point of its env ids)."""
    from cbgym.env.vector import SchedulingMaskedVectorEnv, SchedulingVectorEnv

    t = get(task)
    kwargs = {**t.env_kwargs(_num_requests(t)), **overrides}
    cls = SchedulingMaskedVectorEnv if masked else SchedulingVectorEnv
    return cls(num_envs=num_envs, **kwargs)
