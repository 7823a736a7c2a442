"""What `python -m odesolve.bench` tells its user: the opening lines (device, versions, peers,
what is missing and how to install it, what the error column is measured against), no
project targets unless asked for, and one sentence for a device that is not there.

The bench's workloads are not run here (tests/test_bench.py smoke-runs them): the run is
replaced by a few made-up rows, so these tests take a second or two.
"""

import os
import re
import subprocess
import sys

import jax
import pytest

from odesolve.bench import __main__ as bench_main
from odesolve.bench import _header, _peers, _run


def _without(monkeypatch, *names: str) -> None:
    """Make the peers lookup find nothing for `names`, as if they were not installed."""
    load = _peers.Peer.load
    monkeypatch.setattr(
        _peers.Peer, "load", lambda peer: None if peer.name in names else load(peer)
    )


def test_header_names_device_versions_peers_and_the_reference():
    pytest.importorskip("diffrax")
    lines = _header.lines(jax.devices()[0], "quick", 21)
    text = "\n".join(lines)
    device = jax.devices()[0]
    assert lines[1].startswith(f"device: {device.platform}:{device.id} {device.device_kind}")
    assert f"jax {jax.__version__}" in lines[1]
    assert "peers: diffrax " in text and "jax.experimental.ode" in text
    assert "scipy " in text and "error: each result against" in text and "1e-13" in text
    assert "ratio: run time / diffrax's" in text
    assert "up to 21 timed calls per entry" in lines[0]


def test_a_missing_peer_is_named_with_its_install_command(monkeypatch):
    _without(monkeypatch, "diffrax", "matplotlib", "torchode")
    text = "\n".join(_header.lines(jax.devices()[0], "smoke", 1))
    assert 'not installed: diffrax, matplotlib (pip install -e ".[bench]")' in text
    assert "not installed: torchode (pip install torch" in text
    assert "without diffrax the ratio column is empty and no chart is drawn" in text
    assert "peers: jax.experimental.ode" in text and "diffrax 0" not in text


def test_without_scipy_the_bench_stops_with_one_sentence(monkeypatch, capsys):
    _without(monkeypatch, "scipy")
    assert bench_main.main(["--smoke"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "scipy" in error and 'pip install -e ".[bench]"' in error


def _canned_run(library_ratio: float | None):
    """A stand-in for `_run.run`: one W1 case, as a measured run would return it."""
    row = dict(
        workload="W1",
        case="W1",
        library="odesolve",
        compile_s=1.0,
        compile_reused=False,
        compiled=True,
        run_ms=0.5,
        ratio=library_ratio,
        steps=10,
        vf_evals=61,
        error=1e-6,
        error_of="max |ys - ys_ref|",
        temp_bytes=1000,
        solves_per_s=None,
        batch=None,
        kernels_per_step=20,
    )
    rows = [row]
    if library_ratio is not None:
        rows.append(dict(row, library="diffrax", ratio=1.0, run_ms=0.5 / library_ratio))

    def run(only, mode, repeats):
        peers, _ = _peers.installed(_peers.PEERS)
        return dict(
            rows=rows, notes=[], skipped={}, peers=peers, mode=mode, repeats=1, seconds=0.1
        )

    return run


def test_targets_are_printed_only_when_asked_for(monkeypatch, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(_run, "run", _canned_run(library_ratio=0.9))  # W1's target: <= 0.3
    assert bench_main.main(["--only", "W1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "device: " in out and "error, against the reference: W1: max |ys - ys_ref|" in out
    printed = out.replace(str(tmp_path), "")  # the folder's name may say anything
    assert not re.search(r"\btargets?\b", printed) and not re.search(r"\bmet\b", printed)
    assert (tmp_path / "ratios.png").exists()
    assert bench_main.main(["--only", "W1", "--out", str(tmp_path), "--targets"]) == 0
    assert re.search(r"^W1 target .*: NOT met", capsys.readouterr().out, flags=re.M)


def test_without_diffrax_no_empty_chart_is_written(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(_run, "run", _canned_run(library_ratio=None))
    assert bench_main.main(["--only", "W1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert 'no chart: no ratios to draw without diffrax (pip install -e ".[bench]")' in out
    assert (tmp_path / "results.json").exists() and not (tmp_path / "ratios.png").exists()


@pytest.mark.parametrize("how", ["--device gpu", "JAX_PLATFORMS=cuda"])
def test_asking_for_a_missing_gpu_is_one_sentence(how):
    if jax.default_backend() != "cpu":
        pytest.skip("this machine has an accelerator")
    environment = dict(os.environ)
    arguments = ["--smoke", "--only", "W1"]
    if how.startswith("--"):
        arguments += how.split()
    else:
        environment["JAX_PLATFORMS"] = how.split("=")[1]
    command = [sys.executable, "-m", "odesolve.bench", *arguments]
    done = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr
    assert done.stderr.startswith(f"No GPU is available to JAX on this machine ({how} asks")
