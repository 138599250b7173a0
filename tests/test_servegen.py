"""ServeGen per-client workloads: clients as tenants, rates, burstiness, lengths; bad files."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from cbgym.workload.catalog import load_trace
from cbgym.workload.servegen import TIER_CYCLE, servegen_tenants, servegen_workload
from cbgym.workload.tenants import TIERS


def write_client(folder: Path, n: int, rows: list[str], lengths: dict) -> None:
    (folder / f"chunk-{n}-trace.csv").write_text("\n".join(rows) + "\n")
    with gzip.open(folder / f"chunk-{n}-dataset.json.gz", "wt") as f:
        json.dump(lengths, f)


LENGTHS = {"0": {"input_tokens": "{100: 0.5, 300: 0.5}", "output_tokens": "{0: 0.2, 20: 0.8}"}}


def test_a_hand_made_folder(tmp_path: Path) -> None:
    # client 0: Gamma with shape 0.25 (CV 2) at relative rate 1; client 1: Poisson at rate 3;
    # client 2 has no length file (left out)
    write_client(tmp_path, 0, [f"{600 * k},1.0,2.0,Gamma,0.25,0.1" for k in range(12)], LENGTHS)
    write_client(tmp_path, 1, [f"{600 * k},3.0,1.0,Exponential,0,0" for k in range(12)],
                 LENGTHS)
    (tmp_path / "chunk-2-trace.csv").write_text("0,5.0,1.0,Exponential,0,0\n")
    tr = servegen_workload(tmp_path, 0, 7200, 8.0, seed=3)
    assert set(np.unique(tr.tenant)) == {0, 1}
    assert abs(len(tr) / 7200 - 8.0) < 0.4  # the mix at 8 req/s
    share = (tr.tenant == 1).mean()
    assert abs(share - 0.75) < 0.03  # rates 1 : 3
    gaps = np.diff(tr.arrival_s[tr.tenant == 0])
    assert abs(gaps.std() / gaps.mean() - 2.0) < 0.3  # Gamma shape 0.25: CV 2
    assert set(np.unique(tr.prompt_tokens)) == {100, 300}
    assert set(np.unique(tr.output_tokens)) == {1, 20}  # (0 tokens count as one)
    again = servegen_workload(tmp_path, 0, 7200, 8.0, seed=3)
    assert np.array_equal(again.arrival_s, tr.arrival_s)  # same seed, same workload


@pytest.mark.parametrize("rows, lengths, match", [
    (["0,1.0,1.0,Gamma,0.5"], LENGTHS, r"chunk-0-trace.csv:1: expected 6 fields"),
    (["0,x,1.0,Gamma,0.5,0"], LENGTHS, r"chunk-0-trace.csv:1: window_start_s, rate"),
    (["0,1.0,1.0,Pareto,0.5,0"], LENGTHS, r"pattern 'Pareto'"),
    (["0,1.0,1.0,Gamma,0,0"], LENGTHS, "needs a shape"),
    (["0,1.0,1.0,Exponential,0,0"],
     {"0": {"input_tokens": "{__import__('os'): 1}", "output_tokens": "{1: 1}"}},
     r"\['0'\]\.input_tokens: malformed entry"),
    (["0,1.0,1.0,Exponential,0,0"], {"0": {"input_tokens": "{1: 1}"}}, "output_tokens"),
])
def test_bad_files_name_the_place(tmp_path: Path, rows: list[str], lengths: dict,
                                  match: str) -> None:
    write_client(tmp_path, 0, rows, lengths)
    with pytest.raises(ValueError, match=match):
        servegen_workload(tmp_path, 0, 600, 1.0)


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a folder"):
        servegen_workload(tmp_path / "nope", 0, 600, 1.0)
    write_client(tmp_path, 0, ["0,0,0,,0,0"], LENGTHS)
    with pytest.raises(ValueError, match="rate_rps"):
        servegen_workload(tmp_path, 0, 600, 0.0)
    with pytest.raises(ValueError, match="idle"):
        servegen_workload(tmp_path, 0, 600, 1.0)


def test_the_language_clients(trace_dir: Path | None) -> None:
    folder = trace_dir / "servegen" / "language" / "m-small" if trace_dir else None
    if folder is None or not folder.is_dir():
        pytest.skip("ServeGen data not found under CBGYM_TRACE_DIR")
    tr = servegen_workload(folder, 338_000, 3600, 5.0, seed=0)
    assert abs(len(tr) / 3600 - 5.0) < 0.5
    assert len(np.unique(tr.tenant)) >= 10  # many clients active in that hour
    assert np.all(np.diff(tr.arrival_s) >= 0) and tr.arrival_s.max() < 3600


def test_tiers_go_round_the_clients_and_a_folder_loads_as_them(tmp_path: Path) -> None:
    # four clients with length files (ids 0, 1, 2, 3 by chunk number; chunk 7 has none)
    for n in (0, 3, 5, 11):
        write_client(tmp_path, n, [f"{600 * k},1.0,1.0,Exponential,0,0" for k in range(6)],
                     LENGTHS)
    (tmp_path / "chunk-7-trace.csv").write_text("0,5.0,1.0,Exponential,0,0\n")
    tr = servegen_tenants(tmp_path, days=3600 / 86_400, rate_rps=4.0, seed=1)
    assert set(np.unique(tr.tenant)) == {0, 1, 2, 3}
    for tenant in range(4):
        tier = TIER_CYCLE[tenant % 3]
        assert np.all(tr.slo_class[tr.tenant == tenant] == TIERS[tier][0])
    base = servegen_workload(tmp_path, 0, 3600, 4.0, seed=1)
    assert np.array_equal(base.arrival_s, tr.arrival_s)  # the same draws, tiers added
    # a later span (the replication's days, which the task never drew): its own clock from 0
    later = servegen_tenants(tmp_path, days=1800 / 86_400, rate_rps=4.0, seed=1,
                             start_day=1800 / 86_400)
    base = servegen_workload(tmp_path, 1800, 1800, 4.0, seed=1)
    assert np.array_equal(base.arrival_s, later.arrival_s) and later.arrival_s.max() < 1800
    assert later.name.endswith("@0.0208333d") and "@" not in tr.name  # the span is named
    assert np.all(later.slo_class == np.array([TIERS[t][0] for t in TIER_CYCLE])[
        later.tenant % 3])
    # a folder of client files loads as the tiered mix (three days at 1 request/s, seed 0):
    # clients active all three days this time
    days = tmp_path / "days"
    days.mkdir()
    for n in (0, 3, 5, 11):
        write_client(days, n, [f"{600 * k},1.0,1.0,Exponential,0,0" for k in range(432)],
                     LENGTHS)
    loaded = load_trace(days)
    again = servegen_tenants(days)
    assert np.array_equal(loaded.arrival_s, again.arrival_s)
    assert np.array_equal(loaded.slo_class, again.slo_class)
    for tenant in range(4):
        assert np.all(loaded.slo_class[loaded.tenant == tenant]
                      == TIERS[TIER_CYCLE[tenant % 3]][0])
    assert abs(len(loaded) / (3 * 86_400) - 1.0) < 0.02
    assert loaded.arrival_s.max() > 2.9 * 86_400  # spread over the three days
    with pytest.raises(ValueError, match="ServeGen clients, which takes no options"):
        load_trace(days, drop_zero_output=True)


def test_the_tiered_language_trace_by_name(trace_dir: Path | None) -> None:
    folder = trace_dir / "servegen" / "language" / "m-small" if trace_dir else None
    if folder is None or not folder.is_dir():
        pytest.skip("ServeGen data not found under CBGYM_TRACE_DIR")
    from cbgym.workload.catalog import LOCAL_TRACES

    tr = load_trace("tenants-servegen-language")
    # (the catalogue's count is exact with the numpy this was written with; a numpy whose
    # Generator streams differ draws another sample of the same size)
    assert abs(len(tr) / LOCAL_TRACES["tenants-servegen-language"].rows - 1) < 0.01
    assert tr.name == "tenants-servegen-language"
    # (29 of the 38 clients with length files are active in the first three days)
    assert len(np.unique(tr.tenant)) == 29 and set(np.unique(tr.slo_class)) == {0, 1, 2}
