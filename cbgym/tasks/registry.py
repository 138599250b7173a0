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
| code-vllm-bursty | azure-code-2023 | llama-2-7b/a100-80gb | 0.6-1.0 | 0.8 | 3 s / 0.1 s |
| conv-study-interactive | azure-conv-2023 | cbsjf-paper | 1.0-1.6 | 1.3 | 0.5 s / 0.1 s |
| conv-vllm-kv-pressure | azure-conv-2023 | llama-2-13b/a100-40gb | 1.6-2.8 | 2.5 | 1 s / 0.1 s |
| tenants-noisy-neighbour | tenants-conv-code-2023 | llama-3.1-8b/a100-80gb | 1.0-1.4 | 1.2 | tier |
| tenants-servegen | tenants-servegen-language | llama-3.1-8b/a100-80gb | 1.3-1.9 | 1.6 | tier |
| prefix-conv-mooncake | mooncake-conversation | llama-3.1-8b/h100-80gb | 1.0-1.4 | 1.2 | 5 s |

The code trace's test range (2,646 requests) holds 5 non-overlapping 512-request windows, so
its tasks have 5 test windows (the conv tasks and the noisy neighbour 8, the Mooncake one 7;
tenants-servegen all 78 of its test range's, 8 on validation: its windows differ so much that
8 windows measure random actions' share of the best reference only to about 6 points, one
standard deviation over draws from 32 training windows).
``cbgym/Scheduling-v0`` and ``cbgym/SchedulingMasked-v0`` are :data:`DEFAULT_TASK`. Every
task's env sheds on a shed score once a request can no longer meet its TTFT target
(``shed_rule="unreachable"``) and carries a running-cap score (``admission_cap``). Loads, SLOs
and caps were chosen on the validation windows only (docs/benchmark.md says how, with the
measured baselines; ``tools/tune_caps.py`` tunes the capped reference).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from cbgym.metrics import SLO, SLOSpec
from cbgym.workload.tenants import tier_slos

__all__ = ["DEFAULT_TASK", "TASKS", "Task", "get"]


@dataclass(frozen=True)
class Task:
    """One benchmark task (see the module docstring).

    Attributes:
        splits: (a, b): training windows lie in the first fraction a of the trace's requests,
            validation in [a, b), test in [b, 1).
        engine_args: further :class:`cbgym.EngineConfig` arguments (e.g. a KV capacity).
        references: task-specific reference policies, tuned on the validation windows
            (``tools/tune_caps.py``: the capped ``cb-sjf-work-shed:CAP`` and
            ``cb-sjf-work-fit:CAP``), scored beside
            ``cbgym.tasks.evaluate.REFERENCES``.
        env: further :class:`cbgym.env.SchedulingEnv` arguments (K, R, thresholds, ...).
        validation_windows: how many validation windows (default ``test_windows``): fewer
            than the test's where the test range holds many (tuning and the searches replay
            the validation windows again and again).
    """

    name: str
    summary: str
    trace: str
    engine: str
    train_load: float | tuple[float, float]
    test_load: float
    slo: SLOSpec
    episode_requests: int = 512
    splits: tuple[float, float] = (0.6, 0.7)
    test_windows: int = 8
    validation_windows: int | None = None
    engine_args: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, Any] = field(default_factory=dict)
    references: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        a, b = self.splits
        if not 0 < a < b < 1:
            raise ValueError(f"task {self.name!r}: splits={self.splits!r}: expected 0 < a < b < 1")
        if self.test_windows < 1 or self.episode_requests < 2:
            raise ValueError(f"task {self.name!r}: test_windows >= 1 and episode_requests >= 2")
        if self.validation_windows is not None and self.validation_windows < 1:
            raise ValueError(f"task {self.name!r}: validation_windows="
                             f"{self.validation_windows}: expected at least 1 (or None)")

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

    def window_count(self, split: str = "test") -> int:
        """How many windows :meth:`starts` places on ``split`` by default:
        ``validation_windows`` (else ``test_windows``) on validation, ``test_windows``
        otherwise."""
        if split == "validation" and self.validation_windows is not None:
            return self.validation_windows
        return self.test_windows

    def starts(self, num_requests: int, split: str = "test", count: int | None = None
               ) -> list[int]:
        """``count`` (default :meth:`window_count`) evenly spaced window starts lying wholly
        inside ``split``."""
        lo, hi = self.ranges(num_requests)[split]
        last = hi - self.episode_requests
        if last < lo:
            raise ValueError(f"task {self.name!r}: the {split} range [{lo}, {hi}) cannot hold a "
                             f"{self.episode_requests}-request window")
        n = self.window_count(split) if count is None else count
        if n < 1:
            raise ValueError(f"task {self.name!r}: count={count}: expected at least 1 window")
        return [int(x) for x in np.linspace(lo, last, n).round()]

    def engine_config(self) -> Any:
        """The task's :class:`cbgym.EngineConfig`."""
        from cbgym.engine.config import EngineConfig

        return EngineConfig(preset=self.engine, **self.engine_args)

    def env_kwargs(self, num_requests: int | None, split: str = "train") -> dict[str, Any]:
        """``SchedulingEnv`` arguments for episodes drawn from ``split`` (the train load for
        training, the test load otherwise). ``num_requests=None``: no window range (the
        caller brings another trace)."""
        kwargs = {"trace": self.trace, "engine": self.engine_config(),
                  "load": self.train_load if split == "train" else self.test_load,
                  "slo": self.slo, "episode_requests": self.episode_requests, **self.env}
        if num_requests is not None:
            kwargs["window_start_range"] = self.ranges(num_requests)[split]
        return kwargs


# every task's env sheds a request (on a shed score) once it can no longer meet its TTFT
# target, as the SLO-aware references shed (waited + its own prefill > target), and its action
# carries a running-batch cap (admission control, as the capped reference's)
TASK_ENV: Mapping[str, Any] = MappingProxyType({"shed_rule": "unreachable",
                                                "admission_cap": True})

TASKS: Mapping[str, Task] = MappingProxyType({task.name: task for task in (
    Task("conv-study-overload",
         "Conversation requests on the CB-SJF-Work study's engine past saturation: the "
         "admission order (and dropping requests already late) decides the goodput.",
         trace="azure-conv-2023", engine="cbsjf-paper", train_load=(1.3, 1.9),
         test_load=1.6, slo=SLO(ttft_s=2.0, tpot_s=0.1), env=TASK_ENV,
         references=("cb-sjf-work-shed:28", "cb-sjf-work-fit:32")),
    Task("code-vllm-overload",
         "Code requests (long prompts) on a vLLM-style engine (chunked prefill, paged KV "
         "cache) past saturation, with targets long prompts can meet.",
         trace="azure-code-2023", engine="llama-2-7b/a100-80gb", train_load=(1.1, 1.5),
         test_load=1.3, slo=SLO(ttft_s=5.0, tpot_s=0.2), env=TASK_ENV,
         references=("cb-sjf-work-shed:48",), test_windows=5),
    Task("code-vllm-bursty",
         "Code requests near saturation on the vLLM-style engine: the trace's own bursts "
         "(inter-arrival CV 13) overload the engine for seconds at a time.",
         trace="azure-code-2023", engine="llama-2-7b/a100-80gb", train_load=(0.6, 1.0),
         test_load=0.8, slo=SLO(ttft_s=3.0, tpot_s=0.1), env=TASK_ENV,
         references=("cb-sjf-work-shed:10", "cb-sjf-work-fit:10", "cb-sjf-work-serial:16"),
         test_windows=5),
    Task("conv-study-interactive",
         "Interactive targets (500 ms to the first token) on the study's engine past "
         "saturation: only prompts short enough, and admitted early enough, can meet them.",
         trace="azure-conv-2023", engine="cbsjf-paper", train_load=(1.0, 1.6),
         test_load=1.3, slo=SLO(ttft_s=0.5, tpot_s=0.1), env=TASK_ENV),
    Task("conv-vllm-kv-pressure",
         "Conversation requests on a 13B model with a 40 GB GPU's KV cache (860 blocks of "
         "16 tokens): tens to over a hundred preemptions a window, so victims matter too.",
         trace="azure-conv-2023", engine="llama-2-13b/a100-40gb", train_load=(1.6, 2.8),
         test_load=2.5, slo=SLO(ttft_s=1.0, tpot_s=0.1), env=TASK_ENV),
    Task("tenants-noisy-neighbour",
         "An interactive tenant (conversations, 450 ms / 40 ms) beside a batch tenant whose "
         "prompts are twice as long (code, 30 s / 1 s) on one vLLM-style engine past "
         "saturation: whom to admit, hold back or shed decides both tenants' goodput.",
         trace="tenants-conv-code-2023", engine="llama-3.1-8b/a100-80gb",
         train_load=(1.0, 1.4), test_load=1.2, slo=tier_slos(), episode_requests=1024,
         env={**TASK_ENV, "tenant_features": 2},
         references=("cb-sjf-work-shed:24", "cb-sjf-work-fit:24", "cb-sjf-work-fit-tiers:24",
                     "cb-sjf-work-serial-tiers:24", "priority", "strict-tiers", "vtc", "drr",
                     "wfq", "least-slack", "cb-sjf-work-slo-aging:0.05")),
    Task("tenants-servegen",
         "Alibaba's production clients (the 29 of ServeGen's language-model clients active "
         "in its first three days, with their own rates, burstiness and lengths) in three "
         "SLO tiers on one vLLM-style engine past saturation: which tier to serve first, "
         "and which requests to give up, decide the goodput.",
         trace="tenants-servegen-language", engine="llama-3.1-8b/a100-80gb",
         train_load=(1.3, 1.9), test_load=1.6, slo=tier_slos(), episode_requests=1024,
         env=TASK_ENV, test_windows=78, validation_windows=8,
         references=("cb-sjf-work-shed:64", "cb-sjf-work-fit:64", "cb-sjf-work-fit-tiers:48",
                     "cb-sjf-work-serial-tiers", "priority", "strict-tiers", "vtc", "drr",
                     "wfq", "least-slack", "cb-sjf-work-slo-aging:0.05")),
    Task("prefix-conv-mooncake",
         "Kimi's conversation trace (12k-token prompts, block ids) past saturation on one "
         "H100 with vLLM's prefix caching: the shared system prompt and recent turns hit, "
         "and the cache's state is in the observation (prefix_features).",
         trace="mooncake-conversation", engine="llama-3.1-8b/h100-80gb",
         engine_args={"enable_prefix_caching": True}, train_load=(1.0, 1.4), test_load=1.2,
         slo=SLO(ttft_s=5.0, tpot_s=0.1), test_windows=7,
         env={**TASK_ENV, "prefix_features": True},
         references=("cb-sjf-work-shed", "shortest-uncached-first", "cb-sjf-work-uncached",
                     "hrrn-uncached", "k-lpm:4", "oracle-work-uncached")),
)})


# what cbgym/Scheduling-v0 and cbgym/SchedulingMasked-v0 build: a hard task (the realistic
# engine, KV pressure with preemption, every action matters: order, shedding, victims)
DEFAULT_TASK = "conv-vllm-kv-pressure"


def get(name: str) -> Task:
    """The task called ``name``; a ValueError lists the known ones."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; known: {', '.join(sorted(TASKS))}") from None


def _num_requests(task: Task) -> int:
    from cbgym.workload import load_trace

    return len(load_trace(task.trace))


def _kwargs(task: str, masked: bool, overrides: dict[str, Any]) -> dict[str, Any]:
    """The task's training-env arguments under ``overrides``. Given another ``trace`` (not the
    task's own name), the task's window range (which indexes its own trace) is dropped and its
    trace never loaded.
    The masked variant caps its admissions by STOP, so it has no running-cap score."""
    t = get(task)
    other = "trace" in overrides and overrides["trace"] != t.trace  # its own name keeps it
    n = None if other else _num_requests(t)
    kwargs = t.env_kwargs(n)
    if masked:
        kwargs.pop("admission_cap", None)
    return {**kwargs, **overrides}


def make_env(task: str = DEFAULT_TASK, masked: bool = False, **overrides: Any) -> Any:
    """The task's training env (the entry point of its env ids, and of
    ``cbgym/Scheduling-v0``); ``overrides`` replace any argument (e.g. ``render_mode``, or
    ``trace``: the task's settings on another trace)."""
    from cbgym.env.scheduling_env import SchedulingEnv, SchedulingMaskedEnv

    kwargs = _kwargs(task, masked, overrides)
    return SchedulingMaskedEnv(**kwargs) if masked else SchedulingEnv(**kwargs)


def make_vector_env(num_envs: int = 1, task: str = DEFAULT_TASK, masked: bool = False,
                    **overrides: Any) -> Any:
    """The task's native vector env (the vector entry point of its env ids)."""
    from cbgym.env.vector import SchedulingMaskedVectorEnv, SchedulingVectorEnv
    from cbgym.env.vector_common import native_lacks

    kwargs = _kwargs(task, masked, overrides)
    if native_lacks(tenant_features=bool(kwargs.get("tenant_features")),
                    arrival_features=bool(kwargs.get("arrival_features")),
                    prefix_features=bool(kwargs.get("prefix_features"))):
        from cbgym.env.sync_vector import SyncTaskVectorEnv

        vector = {k: kwargs.pop(k) for k in ("autoreset_mode",) if k in kwargs}
        for k in ("num_threads", "copy", "observation_mode"):
            kwargs.pop(k, None)
        if kwargs.get("max_episode_steps") is not None:  # (the native env's name for it)
            kwargs["max_steps"] = kwargs.pop("max_episode_steps")
        kwargs.pop("max_episode_steps", None)
        return SyncTaskVectorEnv([lambda: make_env(task, masked, **kwargs)] * num_envs,
                                 **vector)
    cls = SchedulingMaskedVectorEnv if masked else SchedulingVectorEnv
    return cls(num_envs=num_envs, **kwargs)
