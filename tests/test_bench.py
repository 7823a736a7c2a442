"""Smoke tests of `python -m odesolve.bench`: the output has the right shape (no timings
are asserted; performance is measured by the bench, never by tests).

The bench runs in a subprocess: it sets its own precision (float64, default promotion),
which this process's strict-promotion configuration would contradict. Compiling every
workload's gradients for two libraries takes about two minutes on 2 cores, so the default
test runs W1 and W4 at their smoke sizes (every kind of entry: peers, the scan limit,
adjoint variants, memory; ~25 s), plus W1 without Diffrax; set ODESOLVE_BENCH_ALL=1 to
smoke-run all of W1-W7.
"""

import json
import os
import subprocess
import sys

import jax.numpy as jnp
import pytest

from odesolve.bench._measure import compile_function
from odesolve.bench._peers import Peer
from odesolve.bench._run import selection
from odesolve.bench._spec import MODES
from odesolve.bench._workloads import WORKLOADS

ROW_FIELDS = {
    "workload",
    "case",
    "library",
    "compile_s",
    "compile_reused",
    "run_ms",
    "ratio",
    "steps",
    "vf_evals",
    "error",
    "error_of",
    "temp_bytes",
    "solves_per_s",
    "batch",
}
META_FIELDS = {"date", "machine", "cpu_count", "backend", "device", "versions", "mode"}


def run_bench(out, *arguments, block_diffrax=False):
    """Run the bench's command line in a fresh interpreter; (completed process, JSON)."""
    block = "sys.modules['diffrax'] = None; " if block_diffrax else ""  # import fails
    code = f"import sys; {block}from odesolve.bench.__main__ import main; sys.exit(main())"
    command = [sys.executable, "-c", code, "--smoke", "--out", str(out), *arguments]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done, json.loads((out / "results.json").read_text())


def check_output(out, done, results, workloads):
    """Every workload has rows with every field, a target verdict, and a plot."""
    assert META_FIELDS <= set(results["meta"])
    assert results["meta"]["mode"] == "smoke"
    for row in results["rows"]:
        assert ROW_FIELDS <= set(row), row
    assert {row["workload"] for row in results["rows"]} == set(workloads)
    assert set(results["targets"]) == set(workloads)
    assert (out / "ratios.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "compile s" in done.stdout and "ratio" in done.stdout


def test_smoke_w1_w4(tmp_path):
    done, results = run_bench(tmp_path, "--only", "W1,W4")
    check_output(tmp_path, done, results, ["W1", "W4"])
    libraries = {row["library"] for row in results["rows"]}
    assert {
        "odesolve",
        "diffrax",
        "odesolve (tape)",
        "lax.scan RK4 (stores every step)",
    } <= libraries
    w1 = {row["library"]: row for row in results["rows"] if row["workload"] == "W1"}
    assert w1["diffrax"]["ratio"] == 1.0
    assert w1["odesolve"]["steps"] == w1["diffrax"]["steps"]
    assert w1["odesolve"]["vf_evals"] == 6 * w1["odesolve"]["steps"] + 1
    assert w1["odesolve"]["error"] < 1e-4 and w1["odesolve"]["temp_bytes"] > 0


def test_runs_without_diffrax(tmp_path):
    done, results = run_bench(tmp_path, "--only", "W1", block_diffrax=True)
    check_output(tmp_path, done, results, ["W1"])
    assert "diffrax" not in {row["library"] for row in results["rows"]}
    assert all(row["ratio"] is None for row in results["rows"])
    assert any(note.startswith("diffrax skipped: not installed") for note in results["notes"])
    assert "pip install diffrax" in done.stdout


@pytest.mark.skipif(
    os.environ.get("ODESOLVE_BENCH_ALL") != "1", reason="minutes on 2 cores; ODESOLVE_BENCH_ALL=1"
)
def test_smoke_every_workload(tmp_path):
    done, results = run_bench(tmp_path)
    measured = [w for w in WORKLOADS if w not in results["skipped"]]
    check_output(tmp_path, done, results, measured)
    # W6's gradient at W3's batch runs W3's executables: compiled once, same compile time.
    w3 = {r["library"]: r for r in results["rows"] if r["workload"] == "W3"}
    w6 = [r for r in results["rows"] if r["case"].startswith("W6 gradient") and r["library"] in w3]
    assert w6 and all(r["compile_reused"] for r in w6)
    assert all(r["compile_s"] == w3[r["library"]]["compile_s"] for r in w6)


def test_workload_specs():
    for workload in WORKLOADS.values():
        assert set(workload.sizes) == set(MODES), workload.id
        assert (workload.cases is None) != (workload.derive is None), workload.id
        assert workload.target.text
    assert [w.id for w in selection("w7")] == ["W2", "W3", "W7"]
    assert [w.id for w in selection("W4, W1")] == ["W1", "W4"]
    with pytest.raises(ValueError, match="W9"):
        selection("W9")


def test_compile_cache_shares_executables():
    """One compile per function and input shapes in a run; new shapes compile anew."""
    double, cache = (lambda x: 2.0 * x), {}
    first = compile_function(double, (jnp.ones(3),), cache)
    again = compile_function(double, (jnp.zeros(3),), cache)
    assert not first.reused and again.reused
    assert again.executable is first.executable and again.compile_s == first.compile_s
    assert not compile_function(double, (jnp.ones(4),), cache).reused
    assert not compile_function(lambda x: 2.0 * x, (jnp.ones(3),), cache).reused
    assert float(again.executable(jnp.ones(3))[0]) == 2.0


def test_w6_shares_w3_batch_on_cpu_except_full():
    """Quick and smoke size W6 like W3 on CPU (its gradient reuses W3's compile); --full
    keeps the stated 2^10, and the GPU 2^14."""
    w3, w6 = WORKLOADS["W3"], WORKLOADS["W6"]
    for mode in ("smoke", "quick"):
        assert w6.size(mode, "cpu") == w3.size(mode, "cpu")
    assert w6.size("full", "cpu") == 2**10 and w3.size("full", "cpu") == 256
    assert w6.size("quick", "gpu") == w6.size("full", "gpu") == 2**14


def test_missing_peer_says_how_to_install():
    assert Peer("nothing", "no_such_module_for_odesolve", "pip install nothing").load() is None
