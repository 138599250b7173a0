"""Roofline iteration-cost model: each operator takes the longer of its compute and memory time.

For one iteration computing T = prefill_tokens + decode_seqs tokens on a tensor-parallel
replica of ``tp`` GPUs, per GPU:

- linear layers: ``max(2 * P_act / tp * T / (eta_c * F), P_lin * bytes / tp / (eta_m * BW))``
  (the weights are read once per iteration whatever T is). ``P_lin`` is every block weight,
  ``P_act`` what one token passes through: equal for a dense model; for a mixture of experts
  ``P_act`` counts the routed and shared experts a token uses. Reading every expert is what a
  batch does once it holds a few dozen tokens (DeepSeek-V2-Lite: an expert goes unused by T
  tokens with probability (58/64)^T, 4% at T = 32), so prefill and batched decode are priced
  right; a decode batch of a handful of sequences reads fewer experts than charged here;
- LM head, for the sampled rows only: ``max(2 * h * V * S / tp / (eta_c * F),
  h * V * bytes / tp / (eta_m * BW))`` (no read at all when S = 0);
- attention: ``max(4 * L * n_q * d * (sum q*c + sum q(q+1)/2) / tp / (eta_a * F),
  kv_bytes_per_token * shard * sum(c + q) / (eta_m * BW))``, where MLA reads its latent
  (``shard`` = 1, replicated) and prices FLOPs per pair as ``ModelSpec.attention_flops_per_pair``;
- elementwise kernels (norms, RoPE, activation, residual adds): per layer the longer of a
  launch floor ``t_elem`` and their memory traffic, which grows with T;
- tensor-parallel all-reduce (tp > 1): two per layer, ring, ``2 (tp-1)/tp * T * h * bytes``
  over NVLink plus a fixed latency each;
- CPU overhead per iteration (and optionally per scheduled sequence);
- swap traffic over the host links (each GPU moves its own KV holding: 1/tp of a GQA
  model's, all of an MLA model's replicated latent).

Calibration (A100-80GB, Llama-2-7B, the Vidur operator profile ``microsoft/vidur``
``data/profiling/compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv``): the linear layers run at
eta_m ~ 0.75 of HBM bandwidth at one token (8.5 ms over 32 layers) and at eta_c ~ 0.71-0.73
of peak at 4096 tokens (7.3 ms per layer); the elementwise kernels cost ~26 us per layer at one
token and ~0.72 ms per layer at 4096 tokens (~250 KB of traffic per token per layer, which
``_ELEM_BYTES`` reproduces). Decode at batch 1 is then ~9.3 ms before attention and LM head.
eta_a = 0.5: FlashAttention-2 reaches 50-73% of A100 peak on dense benchmarks (Dao 2023,
abstract); paged, variable-length serving kernels sit at the low end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cbgym.engine.cost_model import BatchStats, Number, check_coefficient
from cbgym.engine.hardware import GPUS, MODELS, GpuSpec, ModelSpec, check_tp, kv_shard_fraction

# Elementwise traffic per token per layer, in units of dtype-sized vectors: ~20 of hidden width
# (two norms, RoPE on q/k, two residual adds, each reading and writing) and ~4 of MLP width
# (activation reads gate and up, writes one). Fitted to the Vidur A100/H100 profiles above.
_ELEM_HIDDEN_VECTORS = 20
_ELEM_INTER_VECTORS = 4


def _preset_list() -> tuple[str, ...]:
    names = [
        f"{m}/{g}"
        for m in ("llama-2-7b", "llama-2-13b", "llama-3-8b", "mistral-7b")
        for g in ("a100-80gb", "h100-80gb", "h200")
    ]
    names += [
        f"{m}/{g}/tp4"
        for m in ("llama-2-70b", "llama-3-70b")
        for g in ("a100-80gb", "h100-80gb", "h200")
    ]
    # the models disaggregation studies serve (appended: the names above keep their order)
    names += [
        f"{m}/{g}"
        for m in ("llama-3.1-8b", "deepseek-v2-lite")
        for g in ("a100-80gb", "h100-80gb", "h200")
    ]
    names += [
        f"llama-3.1-70b/{g}/tp{tp}" for tp in (4, 8) for g in ("a100-80gb", "h100-80gb", "h200")
    ]
    return tuple(names)


PRESETS: tuple[str, ...] = _preset_list()


@dataclass(frozen=True, slots=True)
class RooflineCostModel:
    """Iteration time of a vLLM replica from first principles (see the module docstring).

    Pure and elementwise: every :class:`BatchStats` field may be a number or an array. The
    scalar path is a dozen float operations on coefficients computed once in ``__post_init__``.

    Args:
        model: Model shape.
        gpu: GPU (every GPU of the replica is the same kind).
        tp: Tensor-parallel degree.
        eta_compute: Achieved fraction of peak FLOP/s in the linear layers.
        eta_memory: Achieved fraction of HBM bandwidth (weights, KV, elementwise traffic).
        eta_attention: Achieved fraction of peak FLOP/s in attention.
        elem_floor_s: Elementwise kernels' time per layer when they move little data (launch
            bound), seconds.
        allreduce_latency_s: Fixed cost of one tensor-parallel all-reduce, seconds.
        eta_link: Achieved fraction of NVLink bandwidth in all-reduce.
        cpu_overhead_s: Host time per iteration not hidden behind the GPU, seconds. vLLM v1
            overlaps most scheduling with execution; v0 paid ~3 ms at batch 8 and ~12.6 ms at
            batch 64 (reference notes), which ``cpu_per_seq_s`` ~ 0.19 ms reproduces.
        cpu_per_seq_s: Additional host time per scheduled sequence, seconds.
    """

    model: ModelSpec
    gpu: GpuSpec
    tp: int = 1
    eta_compute: float = 0.71
    eta_memory: float = 0.75
    eta_attention: float = 0.5
    elem_floor_s: float = 25e-6
    allreduce_latency_s: float = 8e-6
    eta_link: float = 0.8
    cpu_overhead_s: float = 1e-3
    cpu_per_seq_s: float = 0.0
    # Coefficients derived in __post_init__ (seconds per unit named after the underscore).
    _lin_per_token: float = field(init=False, repr=False, compare=False)
    _lin_weights: float = field(init=False, repr=False, compare=False)
    _lm_per_row: float = field(init=False, repr=False, compare=False)
    _lm_weights: float = field(init=False, repr=False, compare=False)
    _att_per_pair: float = field(init=False, repr=False, compare=False)
    _att_per_kv_token: float = field(init=False, repr=False, compare=False)
    _elem_floor: float = field(init=False, repr=False, compare=False)
    _elem_per_token: float = field(init=False, repr=False, compare=False)
    _ar_fixed: float = field(init=False, repr=False, compare=False)
    _ar_per_token: float = field(init=False, repr=False, compare=False)
    _swap_per_byte: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._validate()
        m, g, tp = self.model, self.gpu, self.tp
        flops = self.eta_compute * g.peak_flops  # achieved FLOP/s, linear layers
        att_flops = self.eta_attention * g.peak_flops  # achieved FLOP/s, attention
        bw = self.eta_memory * g.mem_bandwidth  # achieved bytes/s, HBM
        link = self.eta_link * g.interconnect_bytes_per_s  # achieved bytes/s, NVLink
        b = m.dtype_bytes
        coef = {
            # 2 FLOP per MAC, over the weights a token passes through (a mixture of experts:
            # its active experts); the weight read below is every expert
            "_lin_per_token": 2 * m.active_linear_params / tp / flops,
            "_lin_weights": m.linear_params * b / tp / bw,
            "_lm_per_row": 2 * m.lm_head_params / tp / flops,
            "_lm_weights": m.lm_head_params * b / tp / bw,
            # QK^T and PV: 2 FLOP each per (query, key) pair per head dimension
            "_att_per_pair": m.attention_flops_per_pair / tp / att_flops,
            "_att_per_kv_token": m.kv_bytes_per_token * kv_shard_fraction(m, tp) / bw,
            "_elem_floor": m.num_layers * self.elem_floor_s,
            "_elem_per_token": m.num_layers * self._elem_bytes_per_token() / bw,
            # Two all-reduces per layer (after attention and after the MLP); none at tp=1.
            "_ar_fixed": 2 * m.num_layers * self.allreduce_latency_s if tp > 1 else 0.0,
            "_ar_per_token": 2 * m.num_layers * 2 * (tp - 1) / tp * m.hidden_size * b / link,
            # swap_bytes counts one copy of the replica's KV; each GPU moves its holding over
            # its own link: a 1/tp shard of GQA heads, the whole of MLA's replicated latent
            "_swap_per_byte": (
                1.0 / (tp * g.host_link_bytes_per_s)
                if m.attention == "gqa"
                else 1.0 / g.host_link_bytes_per_s
            ),
        }
        for name, value in coef.items():
            object.__setattr__(self, name, float(value))

    def _validate(self) -> None:
        # wrong objects here would only fail later, as an AttributeError deep in __post_init__
        if not isinstance(self.model, ModelSpec):
            raise ValueError(f"RooflineCostModel.model must be a ModelSpec, got {self.model!r}")
        if not isinstance(self.gpu, GpuSpec):
            raise ValueError(f"RooflineCostModel.gpu must be a GpuSpec, got {self.gpu!r}")
        tp = self.tp
        if not isinstance(tp, int | np.integer) or isinstance(tp, bool | np.bool_) or tp < 1:
            raise ValueError(f"RooflineCostModel.tp must be an integer >= 1, got {tp!r}")
        object.__setattr__(self, "tp", int(tp))  # numpy ints become ints for check_tp
        check_tp(self.model, self.tp)
        for name in ("eta_compute", "eta_memory", "eta_attention", "eta_link"):
            value = getattr(self, name)
            check_coefficient("RooflineCostModel", name, value, "> 0")
            if not value <= 1.0:
                raise ValueError(f"RooflineCostModel.{name} must be in (0, 1], got {value}")
        for name in ("elem_floor_s", "allreduce_latency_s", "cpu_overhead_s", "cpu_per_seq_s"):
            check_coefficient("RooflineCostModel", name, getattr(self, name))

    def _elem_bytes_per_token(self) -> float:
        """Elementwise-kernel traffic per token per layer on one GPU, bytes."""
        m = self.model
        vectors = _ELEM_HIDDEN_VECTORS * m.hidden_size + _ELEM_INTER_VECTORS * (
            m.intermediate_size / self.tp
        )
        return vectors * m.dtype_bytes

    @classmethod
    def from_preset(cls, name: str, **overrides: float) -> RooflineCostModel:
        """Build from ``"<model>/<gpu>"`` or ``"<model>/<gpu>/tp<N>"``.

        Any model in :data:`~cbgym.engine.hardware.MODELS` and GPU in
        :data:`~cbgym.engine.hardware.GPUS` parses; :data:`PRESETS` lists the curated ones.

        Args:
            name: e.g. ``"llama-2-7b/a100-80gb"`` or ``"llama-2-70b/h100-80gb/tp4"``.
            **overrides: Other constructor arguments (``cpu_overhead_s=0.0``, ...).

        Raises:
            ValueError: Naming the part that does not parse and listing the valid choices.
        """
        parts = name.strip().lower().split("/")
        if len(parts) not in (2, 3):
            raise ValueError(
                f"preset {name!r} must look like '<model>/<gpu>' or '<model>/<gpu>/tp<N>'; "
                f"e.g. {PRESETS[0]!r}"
            )
        model_name, gpu_name = parts[0], parts[1]
        if model_name not in MODELS:
            raise ValueError(
                f"unknown model {model_name!r} in preset {name!r}; valid models: "
                f"{', '.join(sorted(MODELS))}"
            )
        if gpu_name not in GPUS:
            raise ValueError(
                f"unknown gpu {gpu_name!r} in preset {name!r}; valid gpus: "
                f"{', '.join(sorted(GPUS))}"
            )
        tp = _parse_tp(parts[2], name) if len(parts) == 3 else 1
        return cls(MODELS[model_name], GPUS[gpu_name], tp, **overrides)

    def kernel_params(self) -> tuple[int, np.ndarray]:
        """(kind, coefficients) the engine's kernel prices with (cbgym.engine.pricing)."""
        from cbgym.engine.pricing import ROOFLINE

        return ROOFLINE, np.array([
            self._lin_per_token, self._lin_weights, self._lm_per_row, self._lm_weights,
            self._elem_per_token, self._elem_floor, self._ar_fixed, self._ar_per_token,
            self.cpu_overhead_s, self.cpu_per_seq_s, self._swap_per_byte, self._att_per_pair,
            self._att_per_kv_token], dtype=np.float64)

    def iteration_time(self, stats: BatchStats) -> Number:
        """Seconds for one iteration (an array when any stats field is an array)."""
        from cbgym.engine.pricing import iteration_time

        return iteration_time(*self.kernel_params(), stats)

    def breakdown(self, stats: BatchStats) -> dict[str, Number]:
        """Seconds per component: linear, lm_head, attention, elementwise, allreduce, cpu, swap.

        Their sum is :meth:`iteration_time`. Elementwise over arrays.
        """
        tokens = stats.prefill_tokens + stats.decode_seqs
        rows = stats.sampled_seqs
        pairs = stats.attn_q_ctx + stats.attn_q_sq
        return {
            "linear": np.maximum(self._lin_per_token * tokens, self._lin_weights),
            "lm_head": np.maximum(self._lm_per_row * rows, self._lm_weights * np.minimum(rows, 1)),
            "attention": np.maximum(
                self._att_per_pair * pairs, self._att_per_kv_token * stats.kv_tokens
            ),
            "elementwise": np.maximum(self._elem_per_token * tokens, self._elem_floor),
            "allreduce": self._ar_fixed + self._ar_per_token * tokens,
            "cpu": self.cpu_overhead_s + self.cpu_per_seq_s * stats.num_seqs,
            "swap": self._swap_per_byte * stats.swap_bytes,
        }




def _parse_tp(part: str, name: str) -> int:
    digits = part[2:] if part.startswith("tp") else ""
    if not digits.isdigit() or int(digits) < 1:
        raise ValueError(
            f"bad tensor-parallel part {part!r} in preset {name!r}; expected 'tp<N>' with N >= 1, "
            f"e.g. 'tp4'"
        )
    return int(digits)
