"""Baseline and learned scheduling policies, each a ``decide(DecisionPoint) -> Decision``.

==============================  ========================================================  ==========
name                            admits first                                              privileged
==============================  ========================================================  ==========
name                            admits first                                              privileged
fcfs                            queue order (vLLM's default)                              no
sjf-ctx                         fewest prompt tokens                                      no
cb-sjf-work[:global]            least estimated work c_f + c_p x + c_d yhat               no
cb-sjf-work:hgb                 the same, yhat from the study's frozen predictor          no
sjf-pred[:FILE]                 shortest predicted output (the study's SJF-Pred)          no
ljf-work                        most estimated work (control)                             no
random                          a random priority fixed per request (control)             no
oracle-sjf                      shortest true output                                      yes
oracle-work                     least true work c_f + c_p x + c_d y                       yes
oracle-srpt                     least remaining work, evicting longer running requests    yes
noisy-oracle:ACC                oracle-sjf on lengths shuffled among 1-ACC of requests    yes
noisy-oracle-work:ACC           oracle-work on the same believed lengths                  yes
<key policy>-aging:W            the key in seconds of work minus W x seconds waited       as base
sjf-ctx-slo-aging:W             ... minus W x TTFT targets waited (also cb-sjf-work-)     no
slo-edf                         earliest TTFT deadline; sheds what cannot meet it         no
priority                        (priority, arrival), evicting the largest: vLLM's policy  no
vtc                             the tenant with the least service so far (VTC, OSDI'24)   no
drr                             tenants in a round, a quantum of prompt tokens a visit    no
wfq                             smallest virtual finish tag (self-clocked fair queue)     no
token-bucket                    FCFS; each tenant's prompts rate-limited (token bucket)   no
strict-tiers                    the interactive SLO class first, evicting the lower tier  no
least-slack                     earliest TTFT deadline (arrival + its class's target)     no
cb-sjf-work-shed[:CAP]          cb-sjf-work; sheds as slo-edf; at most CAP running        no
cb-sjf-work-fit[:CAP]           the same; admits only what meets TTFT with its batch      no
cb-sjf-work-fit-tiers[:CAP]     the same, the tighter TTFT target's requests first        no
cb-sjf-work-serial[:CAP]        cb-sjf-work-shed, one prefill at a time                   no
cb-sjf-work-serial-tiers[:CAP]  the same, the tighter TTFT target's requests first        no
oracle-work-shed[:CAP]          cb-sjf-work-shed in oracle-work order (headroom)          yes
learned[:NAME|PATH]             a trained SB3 model (default: the shipped checkpoint)     no
==============================  ========================================================  ==========
"""

from __future__ import annotations

from cbgym.agents.aging import (
    AGING_POLICIES,
    CBSJFWorkAging,
    NoisyOracleAging,
    NoisyOracleWorkAging,
    OracleSJFAging,
    OracleWorkAging,
    SJFCtxAging,
    with_aging,
)
from cbgym.agents.base import KeyPolicy, QueueView
from cbgym.agents.cb_sjf_work import ESTIMATORS, CBSJFWork
from cbgym.agents.fair_queue import DRR, WFQ
from cbgym.agents.fcfs import FCFS
from cbgym.agents.learned import LearnedPolicy
from cbgym.agents.ljf_work import LJFWork
from cbgym.agents.noisy_oracle import NoisyOracle, NoisyOracleWork
from cbgym.agents.oracle_srpt import OracleSRPT
from cbgym.agents.oracles import OracleSJF, OracleWork
from cbgym.agents.params import check_arity
from cbgym.agents.predicted import CBSJFWorkPred, SJFPred
from cbgym.agents.prefix import PREFIX_POLICIES
from cbgym.agents.priority import Priority
from cbgym.agents.random_order import RandomOrder
from cbgym.agents.sjf_ctx import SJFCtx
from cbgym.agents.slo_edf import (
    CBSJFWorkFit,
    CBSJFWorkFitTiers,
    CBSJFWorkSerial,
    CBSJFWorkSerialTiers,
    CBSJFWorkShed,
    OracleWorkShed,
    SLOEarliestDeadline,
)
from cbgym.agents.tiers import LeastSlack, StrictTiers
from cbgym.agents.token_bucket import TokenBucket
from cbgym.agents.vtc import VTC
from cbgym.engine.decision import Policy

POLICIES: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (FCFS, SJFCtx, CBSJFWork, LJFWork, RandomOrder, OracleSJF, OracleWork,
                OracleSRPT, NoisyOracle, NoisyOracleWork, SJFPred, CBSJFWorkPred, *AGING_POLICIES,
                SLOEarliestDeadline, CBSJFWorkShed, CBSJFWorkFit, CBSJFWorkFitTiers,
                CBSJFWorkSerial, CBSJFWorkSerialTiers, OracleWorkShed, Priority, StrictTiers,
                LeastSlack, VTC, DRR, WFQ, TokenBucket, LearnedPolicy, *PREFIX_POLICIES)
}


ENTRY_POINT_GROUP = "cbgym.policies"


def make_policy(spec: str) -> Policy:
    """Build a policy from a name, optionally with one argument after a colon.

    Examples: ``"fcfs"``, ``"noisy-oracle:0.8"``, ``"cb-sjf-work-aging:0.5"``,
    ``"learned:path/to/model.zip"``. A policy of your own: ``"package.module:Class"`` (or
    ``"package.module:Class:ARG"``), imported wherever the spec is built, so ``cbgym
    bench``'s worker processes build it too (a class added to ``POLICIES`` at run time
    exists only in the process that added it); or a name an installed package registers
    in the ``cbgym.policies`` entry-point group (``name = "package.module:Class"``).

    Raises:
        ValueError: unknown name (the message lists the known ones), a module or class that
            cannot be imported, or a bad argument (the message names the parameter).
    """
    name, colon, arg = spec.partition(":")
    if name == CBSJFWork.name and arg and arg not in ESTIMATORS:  # the study's learned key
        name = CBSJFWorkPred.name
    cls = POLICIES.get(name) or _installed(name)
    if cls is None:
        cls = _imported(name, arg)
        if cls is None:
            raise ValueError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}"
                             " (or module.path:Class, or an installed package's "
                             f"{ENTRY_POINT_GROUP} entry point)")
        cls_name, colon, arg = arg.partition(":")  # module:Class[:ARG]
        name = f"{name}:{cls_name}"
    cls = _checked(cls, name)
    if not colon:
        return cls()
    check_arity(cls, name, [arg])
    return cls(arg)  # type: ignore[call-arg]


def _installed(name: str) -> type | None:
    """The class an installed package registers as ``name`` (entry points)."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP, name=name):
        try:
            return ep.load()  # type: ignore[no-any-return]
        except Exception as exc:  # (whatever the package raises: say which entry point)
            raise ValueError(f"policy {name!r}: entry point {ep.value!r} of "
                             f"{ENTRY_POINT_GROUP} failed to load: {exc}") from exc
    return None


def _imported(module: str, rest: str) -> type | None:
    """``module:Class`` (``rest`` starts with the class name, a capitalised identifier, so a
    misspelled ``name:ARG`` never imports anything); None if it is not such a spec, or its
    module does not exist."""
    import importlib

    cls_name = rest.partition(":")[0]
    if not (cls_name.isidentifier() and cls_name[0].isupper()):
        return None
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name == module and "." not in module:
            return None  # (not a module: an unknown policy name)
        raise ValueError(f"policy {module}:{cls_name}: cannot import {module!r}: "
                         f"{exc}") from exc
    except Exception as exc:  # (whatever the module raises on import: one line)
        raise ValueError(f"policy {module}:{cls_name}: importing {module!r} failed: "
                         f"{type(exc).__name__}: {exc}") from exc
    if not hasattr(mod, cls_name):
        raise ValueError(f"policy {module}:{cls_name}: module {module!r} has no {cls_name!r}")
    return getattr(mod, cls_name)  # type: ignore[no-any-return]


def _checked(cls: object, name: str) -> type[Policy]:
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        raise ValueError(f"policy {name!r}: {cls!r} is not a cbgym Policy subclass")
    return cls


__all__ = [
    "POLICIES", "make_policy", "with_aging", "KeyPolicy", "QueueView", "FCFS", "SJFCtx",
    "CBSJFWork", "CBSJFWorkShed", "CBSJFWorkFit", "CBSJFWorkFitTiers", "CBSJFWorkSerial",
    "CBSJFWorkSerialTiers", "OracleWorkShed",
    "LJFWork", "Priority",
    "VTC", "DRR", "WFQ",
    "TokenBucket", "StrictTiers", "LeastSlack", "RandomOrder",
    "SLOEarliestDeadline", "SJFPred", "CBSJFWorkPred",
    "OracleSJF",
    "OracleWork",
    "OracleSRPT",
    "NoisyOracle", "NoisyOracleWork", "SJFCtxAging", "CBSJFWorkAging", "OracleSJFAging",
    "OracleWorkAging", "NoisyOracleAging", "NoisyOracleWorkAging",
]
