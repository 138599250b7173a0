"""A cluster's static description: pools of instances, the KV link, how stale load reports are.

| field | meaning | default |
|---|---|---|
| ``pools`` | :class:`Pool` s: ``role``, ``count``, ``engine`` (pools may differ) | required |
| ``link.nic_gbps`` | each instance's NIC (one, even at tp > 1), Gb/s, duplex | 200 (IB HDR) |
| ``link.setup_s`` | per-transfer setup latency, s | 5e-5 (BLIS: 0.05 ms) |
| ``link.mode`` | ``"bulk"`` (NixlConnector's read after the prefill), ``"pipelined"`` | bulk |
| ``load_report_interval_s`` | routers see load as of the last report (0: live) | 0.05 (llm-d) |

Roles: ``unified`` (today's engine: prefill and decode), ``prefill`` (vLLM's KV producer),
``decode`` (its KV consumer; it may also run deflected prefills itself).

Presets (:meth:`ClusterConfig.preset`): ``"Nx:MODEL/GPU[/tpN]"`` (N unified replicas; ``1x:`` is
one instance) and ``"XpYd:MODEL/GPU[/tpN]"`` (X prefill and Y decode instances, e.g.
``"2p2d:deepseek-v2-lite/a100-80gb"``, the deflection paper's setup), several joined by ``+``
for heterogeneous pools (``"2x:llama-3.1-8b/a100-80gb+2x:llama-3.1-8b/h100-80gb"``). Sources:
``../shared/reference/cluster-disaggregation.md``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from numbers import Real
from typing import Literal

from cbgym.engine.config import EngineConfig

ROLES = ("unified", "prefill", "decode")
Role = Literal["unified", "prefill", "decode"]
LINK_MODES = ("bulk", "pipelined")


def _positive_real(value: object) -> bool:
    return (isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)
            and value > 0)


@dataclass(frozen=True, slots=True)
class Pool:
    """``count`` instances of one ``role``, each an engine built from ``engine``."""

    role: Role
    count: int
    engine: EngineConfig | str = field(default_factory=EngineConfig)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"Pool.role={self.role!r}: expected one of {ROLES}")
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ValueError(f"Pool.count={self.count!r}: expected an int >= 1")
        engine = self.engine
        if isinstance(engine, str):
            try:
                engine = EngineConfig(preset=engine)
            except ValueError as exc:
                raise ValueError(f"Pool.engine={self.engine!r}: not a usable preset: {exc}") \
                    from None
            object.__setattr__(self, "engine", engine)
        if not isinstance(engine, EngineConfig):
            raise TypeError(f"Pool.engine: expected an EngineConfig or a preset name, got "
                            f"{type(engine).__name__}")
        if not engine.num_kv_blocks or engine.num_kv_blocks < 1:
            raise ValueError(f"Pool({self.role!r}).engine: its KV cache holds no block "
                             f"(num_kv_blocks={engine.num_kv_blocks}); an instance must "
                             "hold at least one")
        if self.role != "unified":
            if engine.paper_mode:
                raise ValueError(f"Pool({self.role!r}): a {self.role} instance needs a vLLM "
                                 "engine (the cbsjf-paper mode has no chunks nor KV handoff)")
            if not engine.kv_bytes_per_token:
                raise ValueError(f"Pool({self.role!r}).engine: kv_bytes_per_token is needed "
                                 "to size KV transfers (give it, or use a model/gpu preset)")


@dataclass(frozen=True, slots=True)
class LinkConfig:
    """The KV-transfer network: one NIC per instance (full duplex), max-min fair sharing."""

    nic_gbps: float = 200.0
    setup_s: float = 5e-5
    mode: str = "bulk"

    def __post_init__(self) -> None:
        if not _positive_real(self.nic_gbps):
            raise ValueError(f"LinkConfig.nic_gbps={self.nic_gbps!r}: expected a finite "
                             "bandwidth > 0 (Gb/s; 200 = InfiniBand HDR)")
        if not (isinstance(self.setup_s, Real) and not isinstance(self.setup_s, bool)
                and math.isfinite(self.setup_s) and self.setup_s >= 0):
            raise ValueError(f"LinkConfig.setup_s={self.setup_s!r}: expected seconds >= 0")
        if self.mode not in LINK_MODES:
            raise ValueError(f"LinkConfig.mode={self.mode!r}: expected one of {LINK_MODES}")

    @property
    def nic_bytes_per_s(self) -> float:
        return self.nic_gbps * 1e9 / 8


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Pools of instances and the link between them (module docstring). Instances are
    numbered pool by pool, in the order given."""

    pools: tuple[Pool, ...]
    link: LinkConfig = field(default_factory=LinkConfig)
    load_report_interval_s: float = 0.05

    def __post_init__(self) -> None:
        pools = tuple(self.pools)
        object.__setattr__(self, "pools", pools)
        if not pools or not all(isinstance(p, Pool) for p in pools):
            raise ValueError("ClusterConfig.pools: expected one or more Pool objects")
        roles = {p.role for p in pools}
        if "prefill" in roles and "decode" not in roles:
            raise ValueError("ClusterConfig: a prefill pool needs a decode pool to send its "
                             "KV to")
        if "decode" in roles and "prefill" not in roles:
            raise ValueError("ClusterConfig: a decode pool needs a prefill pool (instances "
                             "that prefill and decode are role='unified')")
        kv = {p.engine.kv_bytes_per_token for p in pools  # type: ignore[union-attr]
              if p.role != "unified"}
        if len(kv) > 1:
            raise ValueError(f"ClusterConfig: prefill and decode pools must serve one model "
                             f"(KV bytes per token differ: {sorted(kv)}); a decode instance "
                             "reads the KV a prefill instance computed")
        caching = {bool(p.engine.enable_prefix_caching) for p in pools}  # type: ignore
        if len(caching) > 1:
            raise ValueError("ClusterConfig: enable_prefix_caching must be the same on every "
                             "pool (with_prefix_caching() turns it on for all)")
        if caching == {True} and self.disaggregated and self.link.mode != "bulk":
            raise ValueError("ClusterConfig: prefix caching on prefill/decode pools needs "
                             f"link mode 'bulk' (got {self.link.mode!r}: which chunks a "
                             "pipelined transfer would skip is not modelled)")
        if not isinstance(self.link, LinkConfig):
            raise TypeError("ClusterConfig.link: expected a LinkConfig")
        r = self.load_report_interval_s
        if not (isinstance(r, Real) and not isinstance(r, bool) and math.isfinite(r) and r >= 0):
            raise ValueError(f"ClusterConfig.load_report_interval_s={r!r}: expected seconds "
                             ">= 0 (0: routers see live load)")

    @property
    def roles(self) -> tuple[str, ...]:
        """Each instance's role, by instance index."""
        return tuple(p.role for p in self.pools for _ in range(p.count))

    @property
    def engines(self) -> tuple[EngineConfig, ...]:
        """Each instance's engine, by instance index."""
        return tuple(p.engine for p in self.pools for _ in range(p.count))  # type: ignore

    @property
    def num_instances(self) -> int:
        return sum(p.count for p in self.pools)

    @property
    def disaggregated(self) -> bool:
        return any(p.role == "prefill" for p in self.pools)

    def instances(self, role: str) -> tuple[int, ...]:
        """Indices of the instances with ``role``."""
        return tuple(i for i, r in enumerate(self.roles) if r == role)

    def with_prefix_caching(self, on: bool = True, salt_by_tenant: bool = False
                            ) -> ClusterConfig:
        """A copy whose every engine has vLLM's automatic prefix caching ``on`` (each
        instance its own cache; docs/prefix-caching.md)."""
        pools = tuple(replace(p, engine=replace(p.engine, enable_prefix_caching=on,
                                                cache_salt_by_tenant=salt_by_tenant))
                      for p in self.pools)
        return replace(self, pools=pools)

    def with_(self, **changes: object) -> ClusterConfig:
        """A copy with fields replaced (validated again)."""
        return replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def preset(cls, name: str, **overrides: object) -> ClusterConfig:
        """``"Nx:MODEL/GPU[/tpN]"`` or ``"XpYd:MODEL/GPU[/tpN]"`` (module docstring), or
        several joined by ``+`` (heterogeneous pools, e.g.
        ``"2x:llama-3.1-8b/a100-80gb+2x:llama-3.1-8b/h100-80gb"``); ``overrides`` replace
        fields (``link=``, ``load_report_interval_s=``)."""
        if not isinstance(name, str):
            raise TypeError(f"ClusterConfig.preset: expected a name such as "
                            f"'4x:llama-3-8b/h100-80gb', got {type(name).__name__}")
        pools: tuple[Pool, ...] = ()
        for part in name.split("+"):
            pools += _preset_pools(name, part)
        return cls(pools, **overrides)  # type: ignore[arg-type]


def _preset_pools(name: str, part: str) -> tuple[Pool, ...]:
    """The pools of one ``Nx:`` or ``XpYd:`` part of preset ``name``."""
    m = re.fullmatch(r"(\d+)x:(.+)", part) or re.fullmatch(r"(\d+)p(\d+)d:(.+)", part)
    if m is None:
        raise ValueError(f"ClusterConfig.preset={name!r}: expected 'Nx:MODEL/GPU' "
                         "(N unified replicas, e.g. '4x:llama-3-8b/h100-80gb') or "
                         "'XpYd:MODEL/GPU' (e.g. '2p2d:deepseek-v2-lite/a100-80gb'), several "
                         "joined by '+'")
    *counts, engine = m.groups()
    if any(int(c) < 1 for c in counts):
        raise ValueError(f"ClusterConfig.preset={name!r}: instance counts must be >= 1")
    try:
        cfg = EngineConfig(preset=engine)
    except ValueError as exc:
        raise ValueError(f"ClusterConfig.preset={name!r}: {exc}") from None
    if len(counts) == 1:
        return (Pool("unified", int(counts[0]), cfg),)
    return Pool("prefill", int(counts[0]), cfg), Pool("decode", int(counts[1]), cfg)
