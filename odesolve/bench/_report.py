"""What a run leaves behind: the table on stdout, `results.json` and `ratios.png`."""

import datetime
import json
import os
import platform
import sys
from pathlib import Path

import jax

COLUMNS = (
    # (header, width, row -> text)
    ("case", 20, lambda r: r["case"]),
    ("library", 40, lambda r: r["library"]),
    ("compile s", 9, lambda r: _number(r["compile_s"], "{:.2f}") + _shared_mark(r)),
    ("run ms", 9, lambda r: _number(r["run_ms"], "{:.3g}")),
    ("ratio", 6, lambda r: _number(r["ratio"], "{:.2f}")),
    ("steps", 7, lambda r: _number(r["steps"], "{:d}")),
    ("vf evals", 9, lambda r: _number(r["vf_evals"], "{:d}")),
    ("error", 8, lambda r: _number(r["error"], "{:.1e}")),
    ("XLA temp", 9, lambda r: _bytes(r["temp_bytes"])),
    ("kernels/step", 12, lambda r: _number(r.get("kernels_per_step"), "{:d}") + _inner_mark(r)),
    ("solves/s", 9, lambda r: _number(r["solves_per_s"], "{:.3g}")),
)


SHARED_NOTE = "* compiled once, for an earlier case: the same function on inputs of the same shapes"
EAGER_NOTE = (
    "~ called as is, outside jit (PyTorch peers, W11): the first call minus the median run time"
)
INNER_NOTE = (
    "+ at least: the step loop runs loops of unknown trip count (stages, save times) whose "
    "kernels, launched at each of their iterations, are not counted"
)


def _shared_mark(row: dict) -> str:
    """`*` for an executable compiled for an earlier case, `~` for an eager entry."""
    if not row.get("compiled", True):
        return "~"
    return "*" if row.get("compile_reused") else ""


def _inner_mark(row: dict) -> str:
    """`+` for a kernel count that leaves out loops run inside the step loop."""
    return (
        "+" if row.get("kernels_per_step") is not None and row.get("inner_loops_per_step") else ""
    )


def _number(value, spec: str) -> str:
    return "-" if value is None else spec.format(value)


def _bytes(count: int | None) -> str:
    """Bytes in B, KB, MB or GB (powers of 1000, as the README quotes them)."""
    if count is None:
        return "-"
    size = float(count)
    for unit in ("B", "KB", "MB"):
        if size < 1000:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.3g} {unit}"
        size /= 1000
    return f"{size:.3g} GB"


def table(rows: list[dict]) -> str:
    """Rows as a fixed-width text table, a rule between cases."""
    line = lambda cells: "  ".join(
        f"{c:<{w}}" if i < 2 else f"{c:>{w}}"
        for i, (c, (_, w, _)) in enumerate(zip(cells, COLUMNS))
    )
    out = [line([h for h, _, _ in COLUMNS])]
    previous = None
    for row in rows:
        if previous is not None and row["case"] != previous:
            out.append("")
        out.append(line([text(row) for _, _, text in COLUMNS]))
        previous = row["case"]
    marks = {_shared_mark(row) for row in rows}
    notes = [note for mark, note in (("*", SHARED_NOTE), ("~", EAGER_NOTE)) if mark in marks]
    if any(_inner_mark(row) for row in rows):
        notes.append(INNER_NOTE)
    if notes:
        out += ["", *notes]
    return "\n".join(out)


def error_lines(rows: list[dict]) -> str:
    """What the error column compares, per workload (per case where a workload's cases
    differ), against the references named at the start of the run."""
    measures: dict[str, dict[str, str]] = {}
    for row in rows:
        if row.get("error_of"):
            measures.setdefault(row["workload"], {})[row["case"]] = row["error_of"]
    parts = []
    for workload, by_case in measures.items():
        if len(set(by_case.values())) == 1:
            parts.append(f"{workload}: {next(iter(by_case.values()))}")
        else:
            parts += [f"{case}: {measure}" for case, measure in by_case.items()]
    return "error, against the reference: " + ("; ".join(parts) if parts else "none measured")


def target_lines(targets: dict) -> str:
    """One line per workload: its target, whether odesolve met it, and the figures."""
    verdict = {True: "met", False: "NOT met", None: "undecided"}
    return "\n".join(
        f"{wid} target {t['target']}: {verdict[t['met']]} ({t['detail']})"
        for wid, t in targets.items()
    )


def metadata(mode: str, repeats: int, peers: dict) -> dict:
    """Where and with what the numbers were measured."""
    device = jax.devices()[0]
    versions = {name: getattr(module, "__version__", None) for name, module in peers.items()}
    versions["jax"], versions["python"] = jax.__version__, platform.python_version()
    versions.pop("jax.experimental.ode", None)  # it is jax's own version
    if "torch" in sys.modules:  # imported by a PyTorch peer
        versions["torch"] = sys.modules["torch"].__version__
    return dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        machine=platform.platform(),
        processor=platform.processor() or platform.machine(),
        cpu_count=os.cpu_count(),
        backend=jax.default_backend(),
        device=f"{device.platform}:{device.id} {device.device_kind}",
        versions=versions,
        mode=mode,
        repeats=repeats,
        method=(
            "compile_s: wall time of jax.jit(f).lower(*inputs).compile(); run_ms: median of "
            "interleaved calls after a warm-up (the compiled entries' rounds, then the eager "
            "entries'), each blocked on; ratio: run_ms / diffrax's in "
            "the same case (W7: compile_s); compile_reused: the executable of an earlier "
            "case (same function, same input shapes) was reused; temp_bytes: XLA "
            "memory_analysis temp size; kernels_per_step, predicates_per_step: operations "
            "launched, and loop conditions and conditionals evaluated, per iteration of "
            "the compiled step loop, from its HLO text (odesolve/bench/_kernels.py); "
            "inner_loops_per_step: loops of unknown trip count inside the step loop, "
            "whose kernels kernels_per_step leaves out (a lower bound where nonzero); "
            "vf_evals: of one forward solve, from the step count; compiled=false (PyTorch "
            "peers, eager, torch.set_num_threads(1)): compile_s is the first call minus the "
            "median, steps and vf_evals as the library counted them"
        ),
    )


def write_json(path: Path, results: dict) -> None:
    path.write_text(json.dumps(results, indent=1, allow_nan=True) + "\n")


def write_plot(path: Path, rows: list[dict], targets: dict, smoke: bool = False) -> bool:
    """Horizontal bars of each library's ratio to Diffrax per case (log scale), with the
    line at 1 (Diffrax) and odesolve's target for each workload in `targets` (empty: none
    drawn); a smoke run's plot says so and draws no targets. False without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False

    matplotlib.use("Agg")  # no display on CI or servers
    import matplotlib.pyplot as plt

    bars = [r for r in rows if r["ratio"] is not None and r["library"] != "diffrax"]
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(bars) + 1.5))
    positions = range(len(bars))[::-1]
    colors = ["tab:blue" if r["library"].startswith("odesolve") else "tab:gray" for r in bars]
    ax.barh(list(positions), [r["ratio"] for r in bars], color=colors)
    marked = False
    for y, row in zip(positions, bars):
        goal = None if smoke else targets.get(row["workload"], {}).get("ratio")
        if goal is not None and row["library"].startswith("odesolve"):
            ax.plot([goal, goal], [y - 0.4, y + 0.4], color="tab:red", linewidth=2)
            marked = True
    ax.set_yticks(list(positions), [f"{r['case']}  {r['library']}" for r in bars], fontsize=7)
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_xscale("log")
    xlabel = "time / diffrax's time, same run (W7: compile time)"
    ax.set_xlabel(f"{xlabel}; red: target" if marked else xlabel)
    title = f"odesolve.bench on {jax.default_backend()}: lower is better"
    if smoke:
        title = f"odesolve.bench --smoke on {jax.default_backend()}: tiny sizes, not a measurement"
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
