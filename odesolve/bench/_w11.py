"""W11: eager calls. `diffeqsolve` called outside `jit`, in a Python loop, as in a
notebook or a script that solves again and again (benchmarks/README.md).

A small problem's compiled solve takes tens of microseconds, so what a call does around
it (checking and normalising its inputs, finding the compiled program, returning the
solution) is the cost a user sees. Each timed call is a loop of `CALLS` solves of
Lotka-Volterra (Tsit5, PID 1e-6), with the save times as a Python-number end (`t1`) or as
an array of times (`SaveAt(ts=...)`, checked on every call), or of `CALLS` gradients by
`jax.grad` outside `jit` (`grad`), or one dense solve read by `CALLS` calls of
`sol.evaluate(t)` at times given as arrays, as a plotting loop reads it (`evaluate`).
"""

import functools

import jax
import jax.numpy as jnp

from . import _reference as reference
from ._problems import LOTKA_VOLTERRA_RATES, LOTKA_VOLTERRA_Y0, lotka_volterra
from ._spec import Case, Entry, Target, Workload
from ._workloads import DIFFRAX_API, _all_met, _row

CALLS = 100
CASES = ("W11 t1", "W11 ts", "W11 grad", "W11 evaluate")
T1 = 5.0
F64 = jnp.float64


def _one_solve(lib, y0, args, saveat):
    sol = lib.diffeqsolve(
        lib.ODETerm(lotka_volterra),
        lib.Tsit5(),
        0.0,
        T1,
        0.01,
        y0,
        args,
        saveat=saveat,
        stepsize_controller=lib.PIDController(rtol=1e-6, atol=1e-6),
    )
    return sol.ys, sol.stats["num_steps"]


def _loop_of_calls(lib, ts):
    """`CALLS` eager solves, one after another, each waited for (as a loop that reads
    its results does); returns the last one's (ys, num_steps)."""
    saveat = lib.SaveAt(t1=True) if ts is None else lib.SaveAt(ts=ts)

    def calls(y0, args):
        for _ in range(CALLS):
            out = jax.block_until_ready(_one_solve(lib, y0, args, saveat))
        return out

    return calls


def _loop_of_gradients(lib):
    """`CALLS` eager gradients of the end state's sum with respect to the rates, as a
    script that differentiates without `jit` calls them; returns the last one's
    (gradient, num_steps)."""

    def end_sum(y0, args):
        ys, steps = _one_solve(lib, y0, args, lib.SaveAt(t1=True))
        return jnp.sum(ys[-1]), steps

    gradient = jax.grad(end_sum, argnums=1, has_aux=True)

    def calls(y0, args):
        for _ in range(CALLS):
            out = jax.block_until_ready(gradient(y0, args))
        return out

    return calls


def _loop_of_evaluations(lib, times: list):
    """One eager dense solve, then `sol.evaluate(t)` at each of `times` (0-d arrays:
    Diffrax compiles again for each new Python number), each waited for; returns the
    last value and the solve's num_steps."""

    def calls(y0, args):
        sol = lib.diffeqsolve(
            lib.ODETerm(lotka_volterra), lib.Tsit5(), 0.0, T1, 0.01, y0, args,
            saveat=lib.SaveAt(dense=True),
            stepsize_controller=lib.PIDController(rtol=1e-6, atol=1e-6),
        )  # fmt: skip
        for t in times:
            value = jax.block_until_ready(sol.evaluate(t))
        return value[None], sol.stats["num_steps"]

    return calls


def _evaluation_entry(name: str, lib, times: list) -> Entry:
    return Entry(name, lambda rows: _loop_of_evaluations(lib, times), eager=True)


def _entry(name: str, lib, ts) -> Entry:
    return Entry(name, lambda rows: _loop_of_calls(lib, ts), eager=True)


def _gradient_entry(name: str, lib) -> Entry:
    return Entry(name, lambda rows: _loop_of_gradients(lib), eager=True)


def cases(size, peers: dict) -> list[Case]:
    """W11's cases: the end only, 11 save times given as an array, the gradient, and a
    dense solution evaluated."""
    y0 = jnp.asarray(LOTKA_VOLTERRA_Y0, F64)
    args = jnp.asarray(LOTKA_VOLTERRA_RATES, F64)
    out = []
    for label, ts in (("t1", None), ("ts", jnp.linspace(0.0, T1, 11, dtype=F64))):
        entries = tuple(_entry(name, peers[name], ts) for name in DIFFRAX_API if name in peers)
        ref = reference.solution(lotka_volterra, y0, 0.0, (T1,) if ts is None else ts, args)
        error = functools.partial(reference.max_abs_error, reference=ref)
        out.append(Case("W11", f"W11 {label}", (y0, args), entries, error, "max |ys - ys_ref|"))
    entries = tuple(_gradient_entry(name, peers[name]) for name in DIFFRAX_API if name in peers)
    loss = lambda ys: jnp.sum(ys[-1])
    ref = reference.sensitivity_gradient(lotka_volterra, y0, 0.0, (T1,), args, loss)
    error = functools.partial(reference.max_rel_error, reference=ref)
    what = "max rel. error of the gradient"
    out.append(Case("W11", "W11 grad", (y0, args), entries, error, what))
    times = list(jnp.linspace(0.0, T1, CALLS, dtype=F64))
    entries = tuple(
        _evaluation_entry(name, peers[name], times) for name in DIFFRAX_API if name in peers
    )
    ref = reference.solution(lotka_volterra, y0, 0.0, (float(times[-1]),), args)
    error = functools.partial(reference.max_abs_error, reference=ref)
    out.append(Case("W11", "W11 evaluate", (y0, args), entries, error, "max |y(t) - y_ref(t)|"))
    return out


def _case_check(rows: list[dict], case: str) -> tuple[bool | None, str]:
    ours, diffrax = _row(rows, case, "odesolve"), _row(rows, case, "diffrax")
    if ours is None or diffrax is None:
        return None, f"{case}: rows missing"
    ratio = ours["run_ms"] / diffrax["run_ms"]
    per_call = 1e3 * ours["run_ms"] / CALLS
    return ratio <= 1.0, f"{case}: {ratio:.2f}x diffrax's time ({per_call:.0f} us a call)"


W11: Workload = Workload(
    "W11",
    f"eager calls: {CALLS} diffeqsolve calls outside jit, Lotka-Volterra, Tsit5",
    "float64",
    "",
    sizes=dict(smoke=None, quick=None, full=None),
    cases=cases,
    target=Target(
        "an eager call costs no more than Diffrax's",
        lambda rows: _all_met([_case_check(rows, case) for case in CASES]),
        ratio=1.0,
    ),
)
