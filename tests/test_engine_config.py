"""Engine configuration: presets resolve, impossible configurations are rejected clearly."""

from __future__ import annotations

import pytest

from cbgym import EngineConfig, LinearCostModel
from cbgym.engine.roofline import RooflineCostModel


def test_default_preset_derives_cost_model_and_kv_capacity() -> None:
    cfg = EngineConfig()
    assert isinstance(cfg.cost_model, RooflineCostModel)
    assert cfg.block_size == 16 and cfg.num_kv_blocks is not None
    # llama-2-7b on an A100-80GB at 0.9 utilisation holds ~119k tokens of KV (512 KiB each)
    assert 110_000 < cfg.kv_capacity_tokens < 125_000
    assert EngineConfig(gpu_memory_utilization=0.5).num_kv_blocks < cfg.num_kv_blocks


def test_paper_preset_uses_the_study_constants() -> None:
    cfg = EngineConfig(preset="cbsjf-paper")
    assert cfg.paper_mode and cfg.block_size == 1 and cfg.kv_capacity_tokens == 65_917
    cost = cfg.cost_model
    assert isinstance(cost, LinearCostModel)
    assert (cost.base_s, cost.prefill_base_s) == (0.012, 0.008)
    assert (cost.prefill_per_token_s, cost.decode_per_seq_s) == (0.00028, 0.00042)


def test_explicit_fields_override_the_preset() -> None:
    cost = LinearCostModel(base_s=0.02)
    cfg = EngineConfig(num_kv_blocks=100, cost_model=cost, block_size=32)
    assert (cfg.num_kv_blocks, cfg.cost_model, cfg.block_size) == (100, cost, 32)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_kv_blocks": 0}, "num_kv_blocks"),
    ({"max_num_batched_tokens": 8}, "max_num_batched_tokens"),
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"block_size": 0}, "block_size"),
    ({"preemption": "drop"}, "preemption"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"max_model_len": 1}, "max_model_len"),
    ({"preset": "llama-9b/a100-80gb"}, "unknown model"),
    ({"preset": "llama-2-7b/tpu"}, "unknown GPU"),
    ({"preset": "llama-2-7b"}, "model/gpu"),
    ({"preset": "llama-2-70b/a100-80gb"}, "does not fit"),
    ({"preset": None}, "cost_model= and num_kv_blocks="),
])
def test_impossible_configs_name_the_parameter(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(**kwargs)
