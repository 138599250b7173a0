"""Multi-tenant workloads from ServeGen's per-client data (Alibaba's model-serving platform).

Each client (``chunk-N``) is a tenant. ``chunk-N-trace.csv`` has one row per 600 s window:
``window_start_s, rate, cv, pattern, p1, p2`` (the inter-arrival distribution: ``Gamma`` with
shape p1, ``Weibull`` with shape p1, ``Exponential``, or empty for an idle window; the rate
is a relative share). ``chunk-N-dataset.json.gz`` maps each 6-hour window's start to the
distributions of input and output lengths, dict literals in strings (``"{12: 0.25, ...}"``),
read here by a strict pattern, never evaluated. Clients without a length file are left out.

:func:`servegen_workload` builds ``duration_s`` seconds from ``start_s``: client rates are
scaled together so the mix offers ``rate_rps`` on average, each window's arrivals are drawn
from its distribution with that window's scaled rate (the shape from p1, the scale set by
the rate; p2 is not needed then), and each request's prompt and output lengths from its
client's distributions of the 6-hour window it falls in (a 0-token length, which the data
holds, counts as one token: every request has a prompt and samples at least one token).
:func:`servegen_tenants` puts the clients in SLO tiers: the ``tenants-servegen-language``
trace of the ``tenants-servegen`` task.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cbgym.workload.tenants import TIERS
from cbgym.workload.trace import Trace

WINDOW_S = 600.0
PATTERNS = ("Gamma", "Weibull", "Exponential", "")
_ENTRY = re.compile(r"\s*(\d+)\s*:\s*([0-9.eE+-]+)\s*")


@dataclass(frozen=True)
class Client:
    """One ServeGen client: its windows (start, relative rate, pattern, shape) and length
    distributions per 6-hour window (start -> (values, probabilities))."""

    name: str
    windows: np.ndarray  # (W, 2): window start, relative rate
    patterns: list[tuple[str, float]]  # per window: pattern, shape parameter
    inputs: dict[float, tuple[np.ndarray, np.ndarray]]
    outputs: dict[float, tuple[np.ndarray, np.ndarray]]


def _distribution(text: str, where: str) -> tuple[np.ndarray, np.ndarray]:
    """``"{length: probability, ...}"`` -> (lengths, probabilities summing to 1)."""
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise ValueError(f"{where}: expected a '{{length: probability, ...}}' string")
    body = body[1:-1].strip()
    if not body:
        return np.zeros(0, np.int64), np.zeros(0)
    values, probs = [], []
    for item in body.split(","):
        m = _ENTRY.fullmatch(item)
        if m is None:
            raise ValueError(f"{where}: malformed entry {item.strip()[:40]!r}, expected "
                             "'length: probability'")
        values.append(int(m.group(1)))
        probs.append(float(m.group(2)))
    v, p = np.array(values, np.int64), np.array(probs)
    if np.any(v < 0) or not np.all(np.isfinite(p)) or np.any(p < 0) or p.sum() <= 0:
        raise ValueError(f"{where}: lengths must be >= 0 and probabilities >= 0, not all 0")
    return v, p / p.sum()


def load_client(trace_csv: Path) -> Client | None:
    """One client's files (None when it has no length file)."""
    name = trace_csv.name.removesuffix("-trace.csv")
    lengths = trace_csv.with_name(f"{name}-dataset.json.gz")
    if not lengths.exists():
        return None
    rows, patterns = [], []
    with trace_csv.open(newline="") as f:
        for line, row in enumerate(csv.reader(f), 1):
            where = f"{trace_csv}:{line}"
            if len(row) != 6:
                raise ValueError(f"{where}: expected 6 fields (window_start_s, rate, cv, "
                                 f"pattern, p1, p2), got {len(row)}")
            try:
                start, rate, shape = float(row[0]), float(row[1]), float(row[4] or 0)
            except ValueError:
                raise ValueError(f"{where}: window_start_s, rate and p1 must be numbers") \
                    from None
            if row[3] not in PATTERNS:
                raise ValueError(f"{where}: pattern {row[3]!r}, expected one of {PATTERNS}")
            if not (math.isfinite(start) and math.isfinite(rate) and rate >= 0
                    and math.isfinite(shape) and shape >= 0):
                raise ValueError(f"{where}: expected finite values, rate and p1 >= 0")
            if rate > 0 and row[3] in ("Gamma", "Weibull") and shape <= 0:
                raise ValueError(f"{where}: a {row[3]} window needs a shape p1 > 0")
            rows.append((start, rate))
            patterns.append((row[3] or "", shape))
    with gzip.open(lengths, "rt") as f:
        data = json.load(f)
    inputs, outputs = {}, {}
    for key, entry in data.items():
        where = f"{lengths}[{key!r}]"
        if not isinstance(entry, dict) or not {"input_tokens", "output_tokens"} <= set(entry):
            raise ValueError(f"{where}: expected input_tokens and output_tokens")
        inputs[float(key)] = _distribution(str(entry["input_tokens"]), where + ".input_tokens")
        outputs[float(key)] = _distribution(str(entry["output_tokens"]),
                                            where + ".output_tokens")
    return Client(name, np.array(rows, np.float64).reshape(-1, 2), patterns, inputs, outputs)


def _gaps(rng: np.random.Generator, pattern: str, shape: float, rate: float,
          span: float) -> np.ndarray:
    """Arrival offsets in [0, span) of a renewal process of mean rate ``rate``."""
    out: list[float] = []
    t = 0.0
    while True:
        if pattern == "Gamma":
            dt = rng.gamma(shape, 1.0 / (rate * shape))
        elif pattern == "Weibull":
            dt = rng.weibull(shape) / (rate * math.gamma(1.0 + 1.0 / shape))
        else:
            dt = rng.exponential(1.0 / rate)
        t += dt
        if t >= span:
            return np.array(out)
        out.append(t)


def _lengths(rng: np.random.Generator, table: dict[float, tuple[np.ndarray, np.ndarray]],
             at: np.ndarray) -> np.ndarray:
    """A length for each time in ``at`` from the 6-hour window it falls in (0 where a window
    has no distribution: the caller drops those requests)."""
    keys = np.array(sorted(table))
    out = np.zeros(len(at), np.int64)
    which = np.searchsorted(keys, at, "right") - 1
    for k in np.unique(which):
        if k < 0:
            continue
        values, probs = table[float(keys[k])]
        if len(values) == 0:
            continue
        mask = which == k
        # (the data has 0-token lengths; every request has at least one token)
        out[mask] = np.maximum(rng.choice(values, size=int(mask.sum()), p=probs), 1)
    return out


def servegen_workload(folder: str | Path, start_s: float, duration_s: float,
                      rate_rps: float, seed: int = 0, slo_class: int = 1) -> Trace:
    """The clients of ``folder`` (e.g. ``$CBGYM_TRACE_DIR/servegen/language/m-small``) as
    tenants, ``duration_s`` seconds from ``start_s``, offering ``rate_rps`` on average
    (module docstring). Tenant ids follow the sorted client names; requests whose window has
    no length distribution are dropped."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"servegen_workload: {folder} is not a folder of ServeGen "
                                "chunk-N-trace.csv files")
    for label, v in (("start_s", start_s), ("duration_s", duration_s), ("rate_rps", rate_rps)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
                or v < 0 or (label != "start_s" and v == 0):
            raise ValueError(f"servegen_workload: {label}={v!r}, expected a number "
                             f"{'>= 0' if label == 'start_s' else '> 0'}")
    files = sorted(folder.glob("chunk-*-trace.csv"),
                   key=lambda p: int(p.name.split("-")[1]))
    clients = [c for c in (load_client(p) for p in files) if c is not None]
    if not clients:
        raise ValueError(f"servegen_workload: no client with both files in {folder}")
    end = start_s + duration_s
    # the mix's mean relative rate over the span, to scale to rate_rps
    total = 0.0
    for c in clients:
        w = c.windows
        overlap = np.clip(np.minimum(w[:, 0] + WINDOW_S, end) - np.maximum(w[:, 0], start_s),
                          0, None)
        total += float((w[:, 1] * overlap).sum())
    if total <= 0:
        raise ValueError(f"servegen_workload: every client is idle in [{start_s}, {end}) s")
    scale = rate_rps * duration_s / total
    rng = np.random.default_rng(seed)
    parts = []
    for tenant, c in enumerate(clients):
        times = []
        for (w0, rate), (pattern, shape) in zip(c.windows, c.patterns, strict=True):
            lo, hi = max(w0, start_s), min(w0 + WINDOW_S, end)
            if hi <= lo or rate <= 0 or pattern == "":
                continue
            times.append(lo + _gaps(rng, pattern, shape, rate * scale, hi - lo))
        if not times:
            continue
        at = np.concatenate(times)
        prompt = _lengths(rng, c.inputs, at)
        output = _lengths(rng, c.outputs, at)
        keep = (prompt > 0) & (output > 0)
        parts.append((at[keep] - start_s, prompt[keep], output[keep],
                      np.full(int(keep.sum()), tenant, np.int32)))
    arrival = np.concatenate([p[0] for p in parts])
    order = np.argsort(arrival, kind="stable")
    cols = [np.concatenate([p[k] for p in parts])[order] for k in range(4)]
    return Trace.from_arrays(cols[0], cols[1], cols[2], tenant=cols[3],
                             slo_class=np.full(len(order), slo_class, np.int16),
                             name=f"servegen:{folder.name}@{start_s:g}+{duration_s:g}s",
                             rebase=False)


# ServeGen publishes no SLOs. Tiers go round the clients in id order, so a tier is not a
# proxy for a client's lengths or rate: which tier to serve is a decision on its own.
TIER_CYCLE = ("interactive", "standard", "batch")
# the local trace ``tenants-servegen-language`` (:func:`cbgym.load_trace`): the first three
# days of the language clients at one request a second on average, seed 0 (the task rescales
# each window's clock to its load, so only the pattern and the mix carry over)
SERVEGEN_DAYS = 3
SERVEGEN_RATE_RPS = 1.0
# how many days the language clients' descriptions cover (2,016 windows of 600 s each)
SERVEGEN_DESCRIBED_DAYS = 14


def servegen_tenants(folder: str | Path, days: float = SERVEGEN_DAYS,
                     rate_rps: float = SERVEGEN_RATE_RPS, seed: int = 0,
                     start_day: float = 0.0) -> Trace:
    """:func:`servegen_workload` over ``days`` days from day ``start_day`` (by default the
    first three: the task ``tenants-servegen``'s trace; later spans are data the task never
    saw), each client a tenant in an SLO tier (:data:`cbgym.workload.tenants.TIERS`): client i
    (in sorted id order, as its tenant id) is in ``TIER_CYCLE[i % 3]``. Tenant ids and tiers
    go by every client with both files, active in the span or not, so a client's tier does
    not depend on the span."""
    trace = servegen_workload(folder, start_day * 86_400.0, days * 86_400.0, rate_rps,
                              seed=seed)
    tier_class = np.array([TIERS[t][0] for t in TIER_CYCLE], np.int16)
    return Trace.from_arrays(trace.arrival_s, trace.prompt_tokens, trace.output_tokens,
                             tenant=trace.tenant, slo_class=tier_class[trace.tenant % 3],
                             name=f"servegen-tiers:{Path(folder).name}"
                             + (f"@{start_day:g}d" if start_day else ""), rebase=False)
