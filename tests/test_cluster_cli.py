"""``cbgym bench --cluster``: arguments checked before any work; a small sweep runs; and
``cbgym.simulate(cluster=...)``."""

from __future__ import annotations

import numpy as np
import pytest

import cbgym
from cbgym import Trace
from cbgym.cli import main


def run(*argv: str) -> int:
    return main(["bench", *argv])


@pytest.mark.parametrize(("argv", "message"), [
    (("--cluster", "2q2d:llama-2-7b/a100-80gb"), "XpYd"),
    (("--routers", "kairos"), "needs --cluster"),
    (("--cluster", "2p2d:llama-2-7b/a100-80gb", "--routers", "nope"), "unknown router"),
    (("--cluster", "1x:llama-2-7b/a100-80gb", "--engine", "llama-2-13b/a100-80gb"),
     "engine options"),
    (("--cluster", "1x:llama-2-7b/a100-80gb", "--policies", "fcfs,sjf-ctx"),
     "one local policy"),
    (("--cluster", "2x:llama-2-7b/a100-80gb", "--routers", "round-robin,kairos"),
     "needs prefill and decode pools"),
    (("--cluster", "1x:llama-2-7b/a100-80gb", "--workers", "2"), "not used with --cluster"),
])
def test_bad_arguments_fail_fast(argv: tuple[str, ...], message: str,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        run(*argv)
    assert message in capsys.readouterr().err


def test_a_small_cluster_sweep(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("--cluster", "2p2d:llama-2-7b/a100-80gb", "--trace", "synthetic-code",
               "--routers", "always-disaggregate,kairos", "--loads", "0.6", "--windows", "1",
               "--window-requests", "150", "--quiet", "--out", str(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "| synthetic-code | 0.6 | kairos |" in out
    assert (tmp_path / "cluster_results.csv").is_file()


def test_simulate_on_a_cluster() -> None:
    rng = np.random.default_rng(3)
    tr = Trace.from_arrays(np.sort(rng.uniform(0, 20, 200)), rng.integers(10, 2000, 200),
                           rng.integers(1, 100, 200), name="small")
    res = cbgym.simulate(tr, cluster="2x:llama-2-7b/a100-80gb", router="least-outstanding",
                         load=0.7)
    assert set(res.requests["decode_instance"]) == {0, 1}
    assert res.summary()["num_finished"] == 200
    with pytest.raises(ValueError, match="not both"):
        cbgym.simulate(tr, engine="llama-2-7b/a100-80gb", cluster="1x:llama-2-7b/a100-80gb")


def test_cbgym_evaluate_on_a_cluster_task(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["evaluate", "--task", "conv-4x-hetero-routing", "--policy", "kairos"])
    assert "needs prefill and decode pools" in capsys.readouterr().err
    assert main(["evaluate", "--task", "conv-4x-hetero-routing", "--policy", "round-robin",
                 "--json"]) == 0
    import json

    doc = json.loads(capsys.readouterr().out)
    assert doc["best_reference"] == "jsq-time"
    assert {r["policy"] for r in doc["rows"]} >= {"round-robin", "random actions"}
