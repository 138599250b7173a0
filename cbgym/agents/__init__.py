"""Baseline and learned scheduling policies, each a ``decide(DecisionPoint) -> Decision``."""

from __future__ import annotations

from cbgym.agents.fcfs import FCFS
from cbgym.engine.decision import Policy

POLICIES: dict[str, type[Policy]] = {
    "fcfs": FCFS,
}


def make_policy(spec: str) -> Policy:
    """Build a policy from a name, optionally with one argument after a colon.

    Examples: ``"fcfs"``, ``"noisy-oracle:0.8"``, ``"learned:path/to/model.zip"``.
    """
    name, _, arg = spec.partition(":")
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}")
    cls = POLICIES[name]
    return cls(arg) if arg else cls()  # type: ignore[call-arg]


__all__ = ["POLICIES", "make_policy", "FCFS"]
