"""`python -m odesolve.bench._gpu FOLDER [--dry-run]`: everything a GPU machine runs, in
one command (`benchmarks/gpu.sh FOLDER`), within a fixed wall-time budget.

Stages, each with a budget of its own, in order of what matters most:
1. the device, JAX's, jaxlib's and CUDA's versions, and the peers found;
2. correctness: the same solves and gradients on the GPU and on the CPU backend
   (`_device_check`), and whether an eager solve copies anything to the host;
3. W3, then W6 and W10 as scaling sweeps (`_sweep`), then W3p, W2, the latent-ODE and
   CNF workloads where the bench has them, and W1, all against Diffrax.
A stage that runs out of time ends where it is, with a note; a watchdog writes the JSON
and exits when the whole budget is spent, whatever is running. Every compiled row
carries XLA's temp memory, the steps and the kernels per step.

Writes into FOLDER: results.json, log.txt (everything printed), ratios.png (each row's
ratio to Diffrax) and scaling.png (solves per second against samples). Exits 1 when the
GPU and the CPU disagree, 2 when the watchdog ended the run. `--dry-run`: the CPU, tiny
sizes and few stages, a few seconds, to check that the command runs. `--rehearse`: the
CPU, tiny sizes, every stage, check and peer of the GPU run (a minute or two).
"""

import argparse
import dataclasses
import json
import os
import sys
import threading
import time
from pathlib import Path

import jax

# Seconds per stage on a GPU. The run as a whole has GPU_BUDGET_S (and the watchdog 15 s
# more), under the 8 minutes the command may take: time to start Python and write files.
# A stage that finishes early leaves its time to the later ones, up to their budgets.
GPU_STAGES = dict(check=70, W3=50, W6=150, W10=70, W3p=35, W2=20, W8=30, W9=30, W1=10)
# The dry run passes through every kind of stage (a check, a sweep, a workload) once,
# with odesolve and the limits only: each Diffrax compile would cost it seconds.
DRY_STAGES = dict(check=30, W10=30, W1=30)
DRY_PEERS = ("odesolve", "jax.experimental.ode")
DRY_CHECKS = ("Lotka-Volterra: grad",)
GPU_SWEEP = [2**10, 2**12, 2**14, 2**16, 2**18]
DRY_SWEEP = [4, 8]
SWEEPS = ("W6", "W10")
GPU_BUDGET_S, DRY_BUDGET_S, REHEARSAL_BUDGET_S = 440.0, 120.0, 600.0


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one run does: stage budgets (seconds), sweep sizes, the bench's size mode,
    timed rounds and seconds of timed calls per case, the check's batch and the
    transformations it checks (all when empty), and the peers it measures (all those
    installed when None)."""

    stages: dict
    sweep_sizes: list
    mode: str
    repeats: int
    case_s: float | None
    check_batch: int
    check_only: tuple = ()
    peers: tuple | None = None


GPU_PLAN = Plan(GPU_STAGES, GPU_SWEEP, "quick", 11, 5.0, 64)
DRY_PLAN = Plan(DRY_STAGES, DRY_SWEEP, "smoke", 1, None, 2, DRY_CHECKS, DRY_PEERS)
# The rehearsal: every stage, check and peer of the GPU run, at the dry run's sizes on the
# CPU (a minute or two): the stages the dry run leaves out, Diffrax's entries among them,
# run as the GPU will run them, so that they cannot break between GPU runs either.
REHEARSAL_PLAN = Plan({name: 60 for name in GPU_STAGES}, DRY_SWEEP, "smoke", 1, None, 2)


class _Tee:
    """A stream that also writes, line-buffered, to the log file."""

    def __init__(self, stream, log):
        self.stream, self.log = stream, log

    def write(self, text: str) -> int:
        self.stream.write(text)
        self.log.write(text)
        self.stream.flush()
        self.log.flush()
        return len(text)

    def flush(self) -> None:
        self.stream.flush()
        self.log.flush()

    def __getattr__(self, name: str):
        """Everything else (`isatty`, `fileno`, `encoding`) is the terminal's."""
        return getattr(self.stream, name)


def say(message: str) -> None:
    """A progress line (with the bench's elapsed-time prefix), flushed at once."""
    from ._measure import progress

    progress(message)


def _cuda_packages() -> dict[str, str]:
    """Versions of the installed CUDA pieces JAX runs on (its CUDA plugin, NVIDIA's
    runtime and libraries), from the packages' metadata."""
    import importlib.metadata

    found = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] or ""
        if name.lower().startswith(("jax-cuda", "jax_cuda", "nvidia-")):
            found[name] = dist.version
    return dict(sorted(found.items()))


def _versions() -> dict:
    """Device, JAX, jaxlib, the backend's platform version (CUDA's, on a GPU) and the
    CUDA packages installed."""
    import jaxlib

    device = jax.devices()[0]
    try:
        platform_version = device.client.platform_version
    except AttributeError:  # not every runtime exposes its client
        platform_version = None
    return dict(
        device=f"{device.platform}:{device.id} {device.device_kind}",
        backend=jax.default_backend(),
        jax=jax.__version__,
        jaxlib=jaxlib.__version__,
        platform_version=platform_version,
        cuda_packages=_cuda_packages(),
    )


def _peak_bytes() -> int | None:
    """Peak memory in use on the default device so far; None where the backend does not
    report it (the CPU)."""
    stats = jax.devices()[0].memory_stats()
    return None if not stats else stats.get("peak_bytes_in_use")


class Run:
    """The document being built, the run's clock and its stages."""

    def __init__(self, out: Path, plan: Plan, budget_s: float, dry: bool):
        self.out, self.plan, self.dry = out, plan, dry
        self.start = time.perf_counter()
        self.end = self.start + budget_s
        self.lock = threading.Lock()
        self.document: dict = dict(meta={}, checks=[], stages={}, notes=[], skipped={}, rows=[])

    def left(self) -> float:
        return self.end - time.perf_counter()

    def stage_deadline(self, name: str) -> float:
        return min(time.perf_counter() + self.plan.stages[name], self.end)

    def note(self, text: str) -> None:
        say(text)
        with self.lock:
            self.document["notes"].append(text)

    def add_rows(self, rows: list[dict]) -> None:
        with self.lock:
            self.document["rows"] += rows

    def write(self, complete: bool) -> None:
        """results.json as it stands (the watchdog writes it too, so under the lock)."""
        from ._report import write_json

        with self.lock:
            self.document["meta"]["complete"] = complete
            self.document["meta"]["seconds"] = round(time.perf_counter() - self.start, 1)
            plain = json.loads(json.dumps(self.document, default=str))
            write_json(self.out / "results.json", plain)


def info_stage(run: Run, peers: dict, peer_notes: list[str]) -> None:
    """Device and versions, the environment JAX reports, the peers found."""
    from ._report import metadata

    versions = _versions()
    say(f"device {versions['device']} ({versions['backend']}, {versions['platform_version']})")
    say(f"jax {versions['jax']}, jaxlib {versions['jaxlib']}, {versions['cuda_packages']}")
    print(jax.print_environment_info(return_string=True), flush=True)
    meta = metadata(run.plan.mode, run.plan.repeats, peers)
    plan = dict(stages=run.plan.stages, sweep_sizes=run.plan.sweep_sizes, repeats=run.plan.repeats)
    meta.update(versions, dry_run=run.dry, budget_s=round(run.end - run.start), plan=plan)
    say("peers found: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()))
    for note in peer_notes:
        run.note(note)
    with run.lock:
        run.document["meta"].update(meta)


def check_stage(run: Run, peers: dict) -> bool:
    """The GPU against the CPU backend; False when any comparison disagrees."""
    from ._device_check import check, eager_host_copies

    say("check: the same solves and gradients on the default device and on the CPU")
    results = check(
        peers["odesolve"],
        run.plan.check_batch,
        say,
        run.plan.check_only,
        run.stage_deadline("check"),
    )
    copies = eager_host_copies(peers["odesolve"])
    say(f"check: an eager solve's copies to the host: {copies}")
    with run.lock:
        run.document["checks"] = results
        run.document["eager_host_copies"] = copies
    not_run = [r for r in results if r["ok"] is None]
    if not_run:
        run.note(f"check: {len(not_run)} of {len(results)} comparisons not run (time is up)")
    failed = [r for r in results if r["ok"] is False]
    for r in failed:
        say(
            f"DISAGREE: {r['problem']} ({r['dtype']}) {r['transformation']}: relative "
            f"difference {r['relative_difference']:.3e} > {r['bound']:.0e}"
        )
    return not failed


def workload_stage(run: Run, workload_id: str, peers: dict, cache: dict) -> None:
    """One bench workload at its GPU size (its smoke size in a dry run), case by case
    until the stage's time is spent."""
    from ._measure import add_ratios, measure_case
    from ._run import missing_requirements
    from ._workloads import WORKLOADS

    workload = WORKLOADS[workload_id]
    missing = missing_requirements(workload, peers["odesolve"])
    if missing:
        run.document["skipped"][workload_id] = f"odesolve has no {', '.join(missing)}"
        return
    deadline = run.stage_deadline(workload_id)
    backend = "gpu" if jax.default_backend() in ("gpu", "cuda", "rocm") else "cpu"
    size = workload.size(run.plan.mode, backend)
    say(f"{workload_id}: {workload.title} (size {size})")
    assert workload.cases is not None
    for case in workload.cases(size, peers):
        if time.perf_counter() > deadline:
            spent = run.plan.stages[workload_id]
            run.note(f"{case.label} skipped: the stage's {spent} s are spent")
            continue
        run.add_rows(add_ratios(measure_case(case, run.plan.repeats, run.plan.case_s, cache)))


def sweep_stage(run: Run, workload_id: str, peers: dict) -> None:
    """A workload at every sweep size, as time allows."""
    from ._sweep import Budget, sweep

    budget = Budget(run.plan.repeats, run.plan.case_s, run.stage_deadline(workload_id))
    rows, notes = sweep(workload_id, run.plan.sweep_sizes, peers, budget, say)
    run.add_rows(rows)
    with run.lock:
        run.document["notes"] += notes


def _stage(run: Run, name: str, action) -> None:
    """Run one stage, timing it and recording device memory; an error in a stage is
    reported and the run goes on with the next."""
    if run.left() < 5.0:
        run.note(f"{name} skipped: the run's time is spent")
        return
    start = time.perf_counter()
    try:
        action()
        failure = None
    except Exception as error:  # a failing stage must not cost the others their turn
        failure = f"{type(error).__name__}: {str(error)[:500]}"
        run.note(f"{name} failed: {failure}")
    with run.lock:
        run.document["stages"][name] = dict(
            seconds=round(time.perf_counter() - start, 1),
            peak_device_bytes=_peak_bytes(),
            failed=failure,
        )
    run.write(complete=False)


def _per_step(rows: list[dict]) -> dict:
    """{case: {library: [kernels, predicates, inner loops] per step}} for the compiled
    rows that loop (see `_kernels.kernel_counts`)."""
    found: dict = {}
    for row in rows:
        if row.get("kernels_per_step") is not None:
            counts = [
                row["kernels_per_step"],
                row.get("predicates_per_step"),
                row.get("inner_loops_per_step"),
            ]
            found.setdefault(row["case"], {})[row["library"]] = counts
    return found


def finish(run: Run, checks_ok: bool) -> None:
    """Targets, table, kernel counts, plots and the JSON."""
    from . import _report, _sweep
    from ._run import targets

    rows = run.document["rows"]
    verdicts = targets(rows, run.document["skipped"], judge=not run.dry)
    print(_report.table(rows), flush=True)
    print(_report.target_lines(verdicts), flush=True)
    with run.lock:
        run.document["targets"] = verdicts
        run.document["checks_ok"] = checks_ok
        run.document["per_step"] = _per_step(rows)
    written = ["results.json", "log.txt"]
    if _report.write_plot(run.out / "ratios.png", rows, verdicts, smoke=run.dry):
        written.append("ratios.png")
    title = f"ensemble scaling on {run.document['meta'].get('device', '?')}"
    sweep_rows = [r for r in rows if r["workload"] in SWEEPS]
    if _sweep.write_plot(run.out / "scaling.png", sweep_rows, title):
        written.append("scaling.png")
    run.write(complete=True)
    say(f"wrote {', '.join(str(run.out / name) for name in written)}")


def _watchdog(run: Run, grace_s: float) -> threading.Timer:
    """Writes the JSON as it stands and ends the process once the budget and `grace_s`
    are spent (a compile or a kernel cannot be interrupted from Python)."""

    def stop():
        say(f"watchdog: {run.end - run.start:.0f} s budget spent; writing what was measured")
        run.write(complete=False)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(2)

    timer = threading.Timer(run.end - time.perf_counter() + grace_s, stop)
    timer.daemon = True
    timer.start()
    return timer


def _arguments(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m odesolve.bench._gpu", description=__doc__)
    parser.add_argument("folder", help="where results.json, log.txt and the plots go")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, a few stages")
    parser.add_argument(
        "--rehearse", action="store_true", help="CPU, tiny sizes, every stage, check and peer"
    )
    parser.add_argument("--budget-s", type=float, default=None, help="seconds for all stages")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    options = _arguments(argv)
    cpu = options.dry_run or options.rehearse
    if cpu:
        jax.config.update("jax_platforms", "cpu")
    # As `python -m odesolve.bench`: float64 where a workload says so, before any array.
    jax.config.update("jax_enable_x64", True)
    out = Path(options.folder)
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "log.txt", "w", buffering=1)
    sys.stdout, sys.stderr = _Tee(sys.__stdout__, log), _Tee(sys.__stderr__, log)
    plan, budget = GPU_PLAN, GPU_BUDGET_S
    if options.rehearse:
        plan, budget = REHEARSAL_PLAN, REHEARSAL_BUDGET_S
    elif options.dry_run:
        plan, budget = DRY_PLAN, DRY_BUDGET_S
    run = Run(out, plan, options.budget_s or budget, cpu)
    _watchdog(run, grace_s=15.0)
    from ._peers import load_peers
    from ._workloads import WORKLOADS

    peers, peer_notes = load_peers()
    if plan.peers is not None:
        peers = {name: module for name, module in peers.items() if name in plan.peers}
        peer_notes.append(f"this run measures {', '.join(peers)} only")
    _stage(run, "info", lambda: info_stage(run, peers, peer_notes))
    verdict = {"ok": True}
    _stage(run, "check", lambda: verdict.update(ok=check_stage(run, peers)))
    cache: dict = {}
    for name in plan.stages:
        if name == "check":
            continue
        if name not in WORKLOADS:
            run.note(f"{name}: not in this bench (no such workload), skipped")
            continue
        if name in SWEEPS:
            _stage(run, name, lambda name=name: sweep_stage(run, name, peers))
        else:
            _stage(run, name, lambda name=name: workload_stage(run, name, peers, cache))
    finish(run, verdict["ok"])
    if not verdict["ok"]:
        say("the GPU and the CPU disagree: see the DISAGREE lines above and results.json")
    return 0 if verdict["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
