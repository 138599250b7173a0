"""The simulated serving engine: configuration, cost models, KV cache, the iteration loop."""

from cbgym.engine.config import PAPER_PRESET, EngineConfig
from cbgym.engine.cost_model import BatchStats, CostModel, LinearCostModel
from cbgym.engine.decision import (
    Decision,
    DecisionPoint,
    InvalidDecisionError,
    Policy,
    PolicyContext,
)
from cbgym.engine.engine import Engine
from cbgym.engine.requests import Status

__all__ = [
    "PAPER_PRESET", "BatchStats", "CostModel", "Decision", "DecisionPoint", "Engine",
    "EngineConfig", "InvalidDecisionError", "LinearCostModel", "Policy", "PolicyContext",
    "Status",
]
