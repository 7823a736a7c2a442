"""`python -m odesolve.bench [--full | --smoke] [--only W2,W4] [--out DIR] [--device cpu|gpu]
[--targets]`

Runs workloads W1-W7 (benchmarks/README.md) for odesolve and every installed peer in one
process, prints a table (compile time, median run time, ratio to Diffrax, steps, vector-field
evaluations, error against a tight reference, XLA temp memory) and writes
DIR/results.json and DIR/ratios.png. It opens with the device, the versions, the peers found
and the commands that install the missing ones. Progress goes to stderr. `--smoke` runs tiny
sizes once to check that the bench runs: it is not a measurement, and judges no target.
`--targets` prints the project's own targets (benchmarks/README.md) and whether they are met.
"""

import argparse
import sys
from pathlib import Path

import jax

from . import _device, _peers


def _arguments(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m odesolve.bench",
        description="Side-by-side benchmark of odesolve against Diffrax and other peers.",
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--full", action="store_true", help="the full sizes (benchmarks/README.md)")
    size.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, 1 repeat: checks that the bench runs (for CI); not a measurement",
    )
    parser.add_argument("--only", default=None, help="comma-separated workloads, e.g. W2,W4")
    parser.add_argument("--out", default="bench_out", help="output folder (default bench_out)")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per entry")
    parser.add_argument(
        "--device",
        choices=sorted(_device.PLATFORMS),
        default=None,
        help="where JAX runs (default: JAX's choice, JAX_PLATFORMS where set)",
    )
    parser.add_argument(
        "--targets",
        action="store_true",
        help="for the project's own checks: print its targets and whether they are met",
    )
    return parser.parse_args(argv)


def _chart_missing(rows: list[dict], peers: dict) -> str | None:
    """Why no chart is drawn, or None when there is one to draw."""
    if "matplotlib" not in peers:
        return f"no chart: matplotlib is not installed ({_peers.BENCH_EXTRA})"
    if not any(row["ratio"] is not None for row in rows):
        return f"no chart: no ratios to draw without diffrax ({_peers.BENCH_EXTRA})"
    return None


def _write(out: Path, results: dict, verdicts: dict, mode: str, targets: bool) -> None:
    """results.json, and ratios.png where there is a chart to draw."""
    from . import _report

    out.mkdir(parents=True, exist_ok=True)
    meta = _report.metadata(mode, results["repeats"], results["peers"])
    meta["seconds"] = round(results["seconds"], 1)
    document = dict(
        meta=meta,
        targets=verdicts,
        notes=results["notes"],
        skipped=results["skipped"],
        rows=results["rows"],
    )
    _report.write_json(out / "results.json", document)
    written = [out / "results.json"]
    no_chart = _chart_missing(results["rows"], _peers.installed(_peers.TOOLS)[0])
    drawn = verdicts if targets else {}  # target marks only where the lines are printed
    if no_chart is not None:
        print(no_chart)
    elif _report.write_plot(out / "ratios.png", results["rows"], drawn, smoke=mode == "smoke"):
        written.append(out / "ratios.png")
    print(f"wrote {', '.join(map(str, written))} ({results['seconds']:.0f} s)")


def main(argv=None) -> int:
    options = _arguments(argv)
    # Before any array exists: W1, W2, W4 and W5 are float64 by specification; the float32
    # workloads state their dtype on every array, so this does not change them.
    jax.config.update("jax_enable_x64", True)
    try:
        device = _device.select(options.device)  # before JAX starts a backend
    except _device.DeviceUnavailable as error:
        print(error, file=sys.stderr)
        return 2
    from . import _header, _report, _run  # after the flag, so no module-level array is float32

    no_scipy = _header.missing_scipy_sentence()
    if no_scipy is not None:
        print(no_scipy, file=sys.stderr)
        return 2
    mode = "full" if options.full else "smoke" if options.smoke else "quick"
    smoke = mode == "smoke"
    repeats = _run.REPEATS[mode] if options.repeats is None else options.repeats
    print("\n".join(_header.lines(device, mode, repeats)))
    if smoke:
        print(_run.SMOKE_NOTE)
    print(flush=True)
    results = _run.run(options.only, mode, options.repeats)
    verdicts = _run.targets(results["rows"], results["skipped"], judge=not smoke)
    print(_report.table(results["rows"]))
    print()
    print(_report.error_lines(results["rows"]))
    if smoke:
        print(_run.SMOKE_NOTE)
    elif options.targets:
        print(_report.target_lines(verdicts))
    for note in results["notes"]:
        print(note)
    _write(Path(options.out), results, verdicts, mode, options.targets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
