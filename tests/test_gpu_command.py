"""`benchmarks/gpu.sh FOLDER --dry-run`, end to end on the CPU: the GPU command runs each
kind of stage (the device check, a scaling sweep, a bench workload) at tiny sizes and
writes its files, so it cannot break between the rare runs on a GPU. No timing is
asserted."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from odesolve.bench._device_check import relative_difference

ROOT = Path(__file__).resolve().parent.parent


def _run_gpu_command(out: Path, mode: str, timeout_s: int) -> dict:
    """`benchmarks/gpu.sh out mode` with this Python; its results.json, once it exits 0."""
    env = dict(os.environ, PYTHON=sys.executable)
    command = [str(ROOT / "benchmarks" / "gpu.sh"), str(out), mode]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "results.json").read_text())


def test_dry_run_writes_results_log_and_plots(tmp_path):
    out = tmp_path / "gpu"
    results = _run_gpu_command(out, "--dry-run", 300)
    files = sorted(path.name for path in out.iterdir())
    assert files == ["log.txt", "ratios.png", "results.json", "scaling.png"]
    meta = results["meta"]
    assert meta["complete"] and meta["dry_run"] and meta["device"].startswith("cpu")
    assert {"jax", "jaxlib", "platform_version"} <= set(meta)
    assert results["checks_ok"] and [c["ok"] for c in results["checks"]] == [True]
    cases = {row["case"] for row in results["rows"]}
    assert cases == {"W10 B=4", "W10 B=8", "W1"}
    for row in results["rows"]:
        if row["library"] == "odesolve":
            assert row["steps"] > 0 and row["kernels_per_step"] > 0 and row["temp_bytes"] > 0
    assert set(results["stages"]) == {"info", "check", "W10", "W1"}
    assert not any(stage["failed"] for stage in results["stages"].values())
    log = (out / "log.txt").read_text()
    assert "device cpu" in log and "check Lotka-Volterra" in log and "W10 sweep" in log
    for name in ("ratios.png", "scaling.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.matrix  # a minute or two: every stage, check and peer of the GPU run
def test_rehearsal_runs_every_stage_of_the_gpu_run_with_every_peer(tmp_path):
    results = _run_gpu_command(tmp_path / "gpu", "--rehearse", 900)
    assert results["meta"]["complete"] and results["meta"]["device"].startswith("cpu")
    assert results["checks_ok"] and len(results["checks"]) >= 8
    assert all(check["ok"] for check in results["checks"])
    stages = results["stages"]
    expected = {"info", "check", "W3", "W6", "W10", "W3p", "W2", "W8", "W9", "W1"}
    assert set(stages) == expected and not any(stage["failed"] for stage in stages.values())
    workloads = {row["workload"] for row in results["rows"] if row["library"] == "diffrax"}
    assert workloads >= {"W3", "W6", "W10", "W3p", "W2", "W8", "W9", "W1"}, workloads


def test_device_difference_is_relative_and_catches_nan():
    expected = {"a": np.array([1.0, -200.0]), "b": np.array([3.0])}
    assert relative_difference(expected, expected) == 0.0
    moved = {"a": np.array([1.0, -199.0]), "b": np.array([3.0])}
    assert relative_difference(moved, expected) == 1.0 / 200.0
    assert relative_difference({"a": np.array([np.nan, 0.0]), "b": 3.0}, expected) == np.inf
