"""cbgym: a trace-driven LLM-serving scheduler simulator and Gymnasium environment."""

from cbgym.capacity import measure_capacity, scale_to_load
from cbgym.cluster import AdmissionConfig, ClientModel, ClusterConfig
from cbgym.engine import Decision, DecisionPoint, EngineConfig, LinearCostModel, Policy
from cbgym.env import SchedulingEnv, SchedulingMaskedEnv, register_envs
from cbgym.metrics import SLO, SimulationResult
from cbgym.simulate import simulate
from cbgym.workload import load_trace, synthetic_trace
from cbgym.workload.trace import Trace

__version__ = "0.1.0"

__all__ = [
    "SLO", "AdmissionConfig", "ClientModel", "ClusterConfig", "Decision", "DecisionPoint",
    "EngineConfig", "LinearCostModel", "Policy",
    "SchedulingEnv", "SchedulingMaskedEnv", "SimulationResult", "Trace", "load_trace",
    "measure_capacity", "scale_to_load", "simulate", "synthetic_trace", "__version__",
]

register_envs()
