"""Every example runs in --quick mode and does what its docstring says.

The examples run in this process (in float64, from conftest), except the sharded one:
its 8 CPU devices must be requested before jax starts, so it runs in a fresh interpreter
and reports its result dict as JSON on its last line of output.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(name: str):
    """Import examples/<name>.py as a module (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_quick(name: str, tmp_path) -> dict:
    """main(["--quick", "--out", ...]) of an example; checks the PNG was written."""
    out = tmp_path / f"{name}.png"
    # optax's Adam adds its int32 step count to floats, which the strict promotion set in
    # conftest rejects; the examples are written for default promotion.
    with jax.numpy_dtype_promotion("standard"):
        result = load_example(name).main(["--quick", "--out", str(out)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return result


def test_neural_ode_fits_the_spiral(tmp_path):
    pytest.importorskip("optax")
    result = run_quick("neural_ode", tmp_path)
    # 100 Adam steps take the mean squared error down by more than 20x (measured: ~140x).
    assert result["final_loss"] < result["initial_loss"] / 20
    # Continued to three times the training window, the fit stays near the truth (the
    # trajectories start up to 1.5 from the origin).
    assert result["extrapolation_error"] < 1.0


@pytest.mark.matrix  # the README's demo, examples/neural_ode.py, trains in the suite
def test_parameter_inference_recovers_lotka_volterra(tmp_path):
    pytest.importorskip("optax")
    result = run_quick("parameter_inference", tmp_path)
    # Each parameter within 5% of the truth from a start 30-40% off (measured: < 0.5%).
    for name, error in result["relative_error"].items():
        assert error < 0.05, (name, result["recovered"][name], result["true"][name])
    # The misfit ends at the noise level (variance 0.01), not above it.
    assert result["final_loss"] < 1.5 * result["noise_variance"]


@pytest.mark.matrix
def test_training_loop_classifies_the_rings(tmp_path):
    pytest.importorskip("optax")
    result = run_quick("training_loop", tmp_path)
    assert result["adjoint"] == "RecursiveCheckpointAdjoint"
    assert result["final_loss"] < result["initial_loss"] / 10
    assert result["accuracy"] > 0.95


@pytest.mark.matrix  # the ensemble under vmap is the suite's batching tests
def test_sharded_ensemble_matches_unsharded(tmp_path):
    out = tmp_path / "sharded_ensemble.png"
    script = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import sharded_ensemble; "
        "print(json.dumps(sharded_ensemble.main(['--quick', '--out', sys.argv[2]])))"
    )
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"  # the forced host devices are CPU devices
    proc = subprocess.run(
        [sys.executable, "-c", script, str(EXAMPLES), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["devices"] == 8
    assert result["simulated_devices"]  # forced CPU devices are named as such
    assert "'batch'" in result["output_spec"]  # the output stays split over the mesh
    # Each device runs the same per-member computation as the single-device batch.
    assert result["max_difference"] <= 1e-12
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.matrix  # Kvaerno5 on Robertson runs in test_stiff.py and the bench's W5
def test_stiff_chemistry_conserves_mass_and_matches_radau(tmp_path):
    result = run_quick("stiff_chemistry", tmp_path)
    # y1 + y2 + y3 is conserved by the equations and by any Runge-Kutta method (a linear
    # invariant), so only rounding remains.
    assert result["conservation_error"] < 1e-12
    # An implicit method crosses the stiff transient in few steps (measured: 90 to t = 1e3).
    assert result["num_steps"] < 500
    if result["scipy_difference"] is not None:
        assert result["scipy_difference"] < 1e-5  # measured: 5e-7


def test_examples_parse_their_command_lines(monkeypatch):
    """Each example parses its own command line (`--help` exits 0 without solving)."""
    # Importing sharded_ensemble sets XLA_FLAGS when unset; keep that out of os.environ.
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
    names = sorted(p.stem for p in EXAMPLES.glob("*.py"))
    assert {"neural_ode", "parameter_inference", "training_loop", "sharded_ensemble"} <= set(names)
    for name in names:
        with pytest.raises(SystemExit) as exit_info:
            load_example(name).parse_args(["--help"])
        assert exit_info.value.code == 0
