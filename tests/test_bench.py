"""Smoke tests of `python -m odesolve.bench`: the output has the right shape (no timings
are asserted; performance is measured by the bench, never by tests).

The bench runs in a subprocess: it sets its own precision (float64, default promotion),
which this process's strict-promotion configuration would contradict. Compiling every
workload's gradients for two libraries takes about two minutes on 2 cores, so the default
test runs W1 and W4 at their smoke sizes (every kind of entry: peers, the scan limit,
adjoint variants, memory; ~25 s), plus W1 without Diffrax; set ODESOLVE_BENCH_ALL=1 to
smoke-run all of W1-W7. The PyTorch peers' rows are checked in process, and only where
torchdiffeq and torchode are installed (CI has no torch).
"""

import json
import os
import re
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from odesolve.bench import _reference as reference
from odesolve.bench._measure import (
    add_ratios,
    compile_function,
    interleaved_medians,
    measure_case,
    repeats_per_entry,
)
from odesolve.bench._peers import Peer
from odesolve.bench._problems import LOTKA_VOLTERRA_RATES, LOTKA_VOLTERRA_Y0, lotka_volterra
from odesolve.bench._run import selection
from odesolve.bench._spec import MODES, Case, Entry, Work
from odesolve.bench._workloads import TORCH_PEERS, WORKLOADS, tsit5_evals

ROW_FIELDS = {
    "workload",
    "case",
    "library",
    "compile_s",
    "compile_reused",
    "compiled",
    "run_ms",
    "ratio",
    "steps",
    "vf_evals",
    "error",
    "error_of",
    "temp_bytes",
    "solves_per_s",
    "batch",
    "kernels_per_step",
    "inner_loops_per_step",
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


def check_output(out, done, results, workloads, chart=True):
    """Every workload has rows with every field, its target unjudged, and a plot (where
    `chart`); the run says it is a smoke run and prints no verdict."""
    assert META_FIELDS <= set(results["meta"])
    assert results["meta"]["mode"] == "smoke"
    for row in results["rows"]:
        assert ROW_FIELDS <= set(row), row
    assert {row["workload"] for row in results["rows"]} == set(workloads)
    assert set(results["targets"]) == set(workloads)
    # Tiny sizes measure nothing: no target is met or missed, on stdout or in the JSON.
    assert all(target["met"] is None for target in results["targets"].values())
    assert "smoke run" in done.stdout and "not a measurement" in done.stdout
    assert not re.search(r"\bmet\b", done.stdout, flags=re.I), done.stdout
    if chart:
        assert (out / "ratios.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "compile s" in done.stdout and "ratio" in done.stdout


def test_smoke_w1(tmp_path):
    done, results = run_bench(tmp_path, "--only", "W1")
    check_output(tmp_path, done, results, ["W1"])
    w1 = {row["library"]: row for row in results["rows"] if row["workload"] == "W1"}
    assert w1["diffrax"]["ratio"] == 1.0
    assert w1["odesolve"]["steps"] == w1["diffrax"]["steps"]
    assert w1["odesolve"]["vf_evals"] == 6 * w1["odesolve"]["steps"] + 1
    assert w1["odesolve"]["error"] < 1e-4 and w1["odesolve"]["temp_bytes"] > 0


@pytest.mark.matrix  # 12 s: W4's peers compile several reverse sweeps
def test_smoke_w4(tmp_path):
    done, results = run_bench(tmp_path, "--only", "W4")
    check_output(tmp_path, done, results, ["W4"])
    libraries = {row["library"] for row in results["rows"]}
    assert {"odesolve (tape)", "lax.scan RK4 (stores every step)"} <= libraries


def test_runs_without_diffrax(tmp_path):
    done, results = run_bench(tmp_path, "--only", "W1", block_diffrax=True)
    check_output(tmp_path, done, results, ["W1"], chart=False)
    assert "diffrax" not in {row["library"] for row in results["rows"]}
    assert all(row["ratio"] is None for row in results["rows"])
    assert any(note.startswith("diffrax skipped: not installed") for note in results["notes"])
    assert 'not installed: diffrax (pip install -e ".[bench]")' in done.stdout
    assert not (tmp_path / "ratios.png").exists()  # no ratios: the chart would be empty


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
    with pytest.raises(ValueError, match="W99"):
        selection("W99")


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


def test_groups_are_timed_one_after_another_and_interleaved_within():
    calls = []
    entry = lambda name: lambda: calls.append(name) or np.zeros(())
    entries = [entry("ode"), entry("torch"), entry("dfx")]
    medians = interleaved_medians(entries, (), [3, 2, 3], [True, False, True])
    assert calls == ["ode", "dfx"] * 3 + ["torch"] * 2
    assert len(medians) == 3 and all(m >= 0 for m in medians)


def test_a_settled_entry_is_called_once_untimed_before_each_timed_call():
    calls = []
    entry = lambda name: lambda: calls.append(name) or np.zeros(())
    entries = [entry("ode"), entry("torch"), entry("dfx")]
    interleaved_medians(entries, (), [2, 2, 2], [True, False, True], [True, False, True])
    assert calls == ["ode", "ode", "dfx", "dfx"] * 2 + ["torch"] * 2


def test_missing_peer_says_how_to_install():
    assert Peer("nothing", "no_such_module_for_odesolve", "pip install nothing").load() is None


def test_eager_entries_are_measured_apart():
    """An eager entry (as the PyTorch peers): no compile and no XLA memory, the steps and
    evaluations it counted, compile time the first call minus the median; its repeats are
    budgeted apart from the JAX entries'; W7 leaves it out."""
    twice = lambda x: 2.0 * x
    jax_entry = Entry("jax", lambda rows: lambda x: (twice(x), jnp.asarray(3)), tsit5_evals)
    eager = Entry("eager", lambda rows: lambda x: (twice(np.asarray(x)), Work(3, 19)), eager=True)
    error = lambda y: float(np.max(np.abs(np.asarray(y) - 2.0)))
    case = Case("W3", "W3 B=2", (jnp.ones(2),), (jax_entry, eager), error, "max error")
    rows = {row["library"]: row for row in add_ratios(measure_case(case, repeats=3))}
    assert ROW_FIELDS <= set(rows["eager"])
    assert rows["jax"]["compiled"] and rows["jax"]["temp_bytes"] is not None
    assert not rows["eager"]["compiled"] and rows["eager"]["temp_bytes"] is None
    for row in rows.values():
        assert (row["steps"], row["vf_evals"]) == (3, 19), row["library"]
    assert rows["eager"]["compile_s"] >= 0.0 and rows["eager"]["error"] == 0.0
    assert repeats_per_entry([True, True, False], [0.1, 0.1, 5.0], 7, 10.0) == [7, 7, 3]
    assert [row["library"] for row in WORKLOADS["W7"].derive(list(rows.values()))] == ["jax"]


def test_torch_peers_rows():
    """With torchdiffeq and torchode installed (not on CI): their W3 rows at the smoke size,
    and their W1/W2 adapters on a short horizon against the scipy reference (~9 s)."""
    peers = {name: pytest.importorskip(name) for name in TORCH_PEERS}
    from odesolve.bench import _torch

    (case,) = WORKLOADS["W3"].cases(WORKLOADS["W3"].size("smoke", "cpu"), peers)
    rows = {row["library"]: row for row in add_ratios(measure_case(case, repeats=1))}
    assert set(rows) == {label for _, label in _torch.LABELS.values()}
    for row in rows.values():
        assert ROW_FIELDS <= set(row) and not row["compiled"] and row["temp_bytes"] is None
        assert row["steps"] > 0 and row["vf_evals"] == 6 * row["steps"] + 1
        assert row["error"] < 1e-5 and row["compile_s"] >= 0.0
    ts = jnp.linspace(0.0, 1.0, 5)
    y0, rates = jnp.asarray(LOTKA_VOLTERRA_Y0), jnp.asarray(LOTKA_VOLTERRA_RATES)
    options = dict(tolerance=1e-8, dt0=0.01)
    ys_ref = reference.solution(lotka_volterra, y0, 0.0, ts, rates)
    for entry in _torch.lotka_volterra_entries(peers, ts, y0, rates, gradient=False, **options):
        ys, work = entry.build({})(rates)
        assert ys.shape == (5, 2) and reference.max_abs_error(ys, ys_ref) < 1e-6, entry.library
        assert work.steps > 0 and work.vf_evals == 6 * work.steps + 1, entry.library
    loss = lambda ys: jnp.sum(ys**2)
    grad_ref = reference.sensitivity_gradient(lotka_volterra, y0, 0.0, ts, rates, loss)
    for entry in _torch.lotka_volterra_entries(peers, ts, y0, rates, gradient=True, **options):
        grad, work = entry.build({})(rates)
        assert reference.max_rel_error(grad, grad_ref) < 1e-5, entry.library


def test_w5_target_compares_at_the_same_tolerances():
    """W5 compares odesolve and Diffrax at the same tolerances, shows both errors, and
    needs odesolve's error no larger than Diffrax's and its forward error (in units of
    the tolerance) to honour the tolerance."""
    row = lambda case, library, ratio, error: dict(
        case=case, library=library, ratio=ratio, error=error
    )
    check = WORKLOADS["W5"].target.check
    diffrax = row("W5 forward", "diffrax", 1.0, 0.1)
    met, detail = check([row("W5 forward", "odesolve", 0.3, 0.05), diffrax])
    assert met and "0.30, error 5.0e-02 vs Diffrax's 1.0e-01" in detail
    assert check([row("W5 forward", "odesolve", 0.3, 0.5), diffrax])[0] is False  # less accurate
    loose = row("W5 forward", "diffrax", 1.0, 50.0)
    assert check([row("W5 forward", "odesolve", 0.3, 20.0), loose])[0] is False  # over 3 tol
    assert check([row("W5 forward", "odesolve", 0.6, 0.05), diffrax])[0] is False
    # A gradient's error is not bounded by the tolerance, only by Diffrax's.
    gradient = [row("W5 gradient", "odesolve", 0.3, 9.0), row("W5 gradient", "diffrax", 1, 10.0)]
    assert check(gradient)[0] is True
    gradient = [row("W5 gradient", "odesolve", 0.3, 1e-6), row("W5 gradient", "diffrax", 1, 1e-9)]
    assert check(gradient)[0] is False
    assert check([row("W5 forward", "odesolve", 0.3, 0.5)])[0] is None


def test_smoke_plot_draws_no_targets(tmp_path, monkeypatch):
    """The ratios plot draws each workload's target, except in a smoke run."""
    pytest.importorskip("matplotlib")
    from matplotlib.axes import Axes

    from odesolve.bench import _report

    drawn, plot = [], Axes.plot
    record = lambda self, *args, **kwargs: (
        drawn.append(kwargs.get("color")) or plot(self, *args, **kwargs)
    )
    monkeypatch.setattr(Axes, "plot", record)
    rows = [dict(workload="W1", case="W1", library="odesolve", ratio=0.3)]
    for smoke, lines in ((False, ["tab:red"]), (True, [])):
        drawn.clear()
        assert _report.write_plot(tmp_path / "ratios.png", rows, {"W1": {"ratio": 0.5}}, smoke)
        assert drawn == lines
