"""The simulated serving engine: configuration, cost models, the compiled iteration, its door.

Read the iteration in this order: :mod:`cbgym.engine.loop` (advance / decide),
:mod:`cbgym.engine.step_vllm` (vLLM v1's token-budget pass) or :mod:`cbgym.engine.step_study`
(the CB-SJF-Work study's step), :mod:`cbgym.engine.execute` (pricing, tokens, retirement),
:mod:`cbgym.engine.transitions` (a request's moves), over the data in
:mod:`cbgym.engine.layout`. ``NUMBA_DISABLE_JIT=1`` runs all of it as plain Python.
"""

from cbgym.engine.config import PAPER_PRESET, EngineConfig
from cbgym.engine.cost_model import BatchStats, CostModel, LinearCostModel
from cbgym.engine.decision import (
    Decision,
    DecisionPoint,
    InvalidDecisionError,
    Policy,
    PolicyContext,
)
from cbgym.engine.engine import Engine, EngineStuckError
from cbgym.engine.requests import Status

__all__ = [
    "PAPER_PRESET", "BatchStats", "CostModel", "Decision", "DecisionPoint", "Engine",
    "EngineConfig", "EngineStuckError", "InvalidDecisionError", "LinearCostModel", "Policy",
    "PolicyContext", "Status",
]
