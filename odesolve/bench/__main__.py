"""`python -m odesolve.bench [--full | --smoke] [--only W2,W4] [--out DIR]`

Runs workloads W1-W7 (benchmarks/README.md) for odesolve and every installed peer in one
process, prints a table (compile time, median run time, ratio to Diffrax, steps, vector-field
evaluations, error against a tight reference, XLA temp memory) and writes
DIR/results.json and DIR/ratios.png. Progress goes to stderr. `--smoke` runs tiny sizes once
to check that the bench runs: it is not a measurement, and judges no target.
"""

import argparse
import sys
from pathlib import Path

import jax


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
    return parser.parse_args(argv)


def main(argv=None) -> int:
    options = _arguments(argv)
    # Before any array exists: W1, W2, W4 and W5 are float64 by specification; the float32
    # workloads state their dtype on every array, so this does not change them.
    jax.config.update("jax_enable_x64", True)
    from . import _report, _run  # after the flag, so no module-level array is float32

    mode = "full" if options.full else "smoke" if options.smoke else "quick"
    smoke = mode == "smoke"
    if smoke:
        print(_run.SMOKE_NOTE)
    results = _run.run(options.only, mode, options.repeats)
    verdicts = _run.targets(results["rows"], results["skipped"], judge=not smoke)
    print(_report.table(results["rows"]))
    print()
    print(_run.SMOKE_NOTE if smoke else _report.target_lines(verdicts))
    for note in results["notes"]:
        print(note)
    out = Path(options.out)
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
    if _report.write_plot(out / "ratios.png", results["rows"], verdicts, smoke=smoke):
        written.append(out / "ratios.png")
    else:
        print("plot skipped: matplotlib is not installed (pip install matplotlib)")
    print(f"wrote {', '.join(map(str, written))} ({results['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
