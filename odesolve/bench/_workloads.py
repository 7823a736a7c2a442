"""Workloads W1-W7 (described in benchmarks/README.md) as named specs.

Every workload is built from the peers' modules: odesolve and Diffrax share one API, so
`_with_each_api` builds both from the same function of the module; the PyTorch peers'
entries come from `_torch` (W1, W2, W3, W6). Dtypes are explicit
(float64 for Lotka-Volterra and Robertson, float32 for the neural ODE), so the bench means
the same thing whatever precision the caller's process defaults to.
"""

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _reference as reference
from ._limit import RK4, evals_per_step, fixed_step_solve, tableau_of
from ._measure import add_ratios
from ._peers import odeint_solve
from ._problems import (
    LOTKA_VOLTERRA_RATES,
    LOTKA_VOLTERRA_Y0,
    ROBERTSON_RATES,
    ROBERTSON_Y0,
    lotka_volterra,
    neural_field,
    robertson,
)
from ._spec import Case, Entry, Target, Workload

F64, F32 = jnp.float64, jnp.float32
DIFFRAX_API = ("odesolve", "diffrax")
TORCH_PEERS = ("torchdiffeq", "torchode")


def tsit5_evals(steps: int) -> int:
    """Tsit5 is FSAL: 6 new stages per step (accepted or not) and 1 at the start."""
    return 6 * steps + 1


def reversible_tsit5_evals(steps: int) -> int:
    """`Reversible(Tsit5())`: a Tsit5 step from z (7 stages, the last for the error
    estimate) and one back from y (6), per step, and 1 at the start."""
    return 13 * steps + 1


def sum_of_squares(ys):
    return jnp.sum(ys**2)


def mean_of_squares(ys):
    return jnp.mean(ys**2)


def _with_each_api(peers: dict, make, evals=tsit5_evals) -> list[Entry]:
    """An entry for odesolve and Diffrax (when loaded), from `make(module) -> function`."""
    return [
        Entry(name, functools.partial(lambda module, rows: make(module), peers[name]), evals)
        for name in DIFFRAX_API
        if name in peers
    ]


def _torch_entries(peers: dict, make: str, *args, **kwargs) -> list[Entry]:
    """The installed PyTorch peers' entries from `_torch.<make>(peers, ...)`; none when
    neither is installed (`_torch` imports torch, so it is imported only then)."""
    if not any(name in peers for name in TORCH_PEERS):
        return []
    from . import _torch

    return getattr(_torch, make)(peers, *args, **kwargs)


def _limit_entry(label: str, solve_with_steps, tableau, steps_from: str | int) -> Entry:
    """A fixed-step `lax.scan` entry; `steps_from` is a step count, or the label of an
    earlier entry whose (largest) step count it copies."""

    def build(rows):
        n = steps_from if isinstance(steps_from, int) else rows[steps_from]["steps"]
        run = solve_with_steps(n)
        return lambda *inputs: (run(*inputs), jnp.asarray(n))

    evals = lambda steps: evals_per_step(tableau) * steps + 1
    return Entry(label, build, evals, comparable=isinstance(steps_from, int))


def _gradient(solve, loss):
    """`args -> (d loss(ys) / d args, num_steps)` for `solve(args) -> (ys, num_steps)`."""

    def loss_and_steps(args):
        ys, steps = solve(args)
        return loss(ys), steps

    return jax.grad(loss_and_steps, has_aux=True)


# --- W1, W2: Lotka-Volterra, adaptive Tsit5, 200 save times -------------------------------


def _lv_problem():
    ts = jnp.linspace(0.0, 50.0, 200, dtype=F64)
    return ts, jnp.asarray(LOTKA_VOLTERRA_Y0, F64), jnp.asarray(LOTKA_VOLTERRA_RATES, F64)


def _lv_solve(lib, ts, y0, args):
    """W1's solve with any library that has Diffrax's API; (ys, num_steps)."""
    sol = lib.diffeqsolve(
        lib.ODETerm(lotka_volterra),
        lib.Tsit5(),
        0.0,
        50.0,
        0.01,
        y0,
        args,
        saveat=lib.SaveAt(ts=ts),
        stepsize_controller=lib.PIDController(rtol=1e-8, atol=1e-8),
        max_steps=4096,
    )
    return sol.ys, sol.stats["num_steps"]


def _w1_cases(size, peers: dict) -> list[Case]:
    ts, y0, args = _lv_problem()
    entries = _with_each_api(peers, lambda lib: lambda a: _lv_solve(lib, ts, y0, a))
    if "jax.experimental.ode" in peers:
        odeint = functools.partial(odeint_solve, peers["jax.experimental.ode"], lotka_volterra)
        solve = lambda a: (odeint(y0, ts, a, rtol=1e-8, atol=1e-8), None)
        entries.append(Entry("jax.experimental.ode (Dopri5)", lambda rows: solve))
    entries += _torch_entries(
        peers, "lotka_volterra_entries", ts, y0, args, gradient=False, tolerance=1e-8, dt0=0.01
    )
    tsit5 = tableau_of(peers["odesolve"].Tsit5)
    scan = lambda n: lambda a: fixed_step_solve(lotka_volterra, tsit5, y0, 0.0, 50.0, n, a)
    entries.append(_limit_entry("lax.scan Tsit5 (limit)", scan, tsit5, "odesolve"))
    ys_ref = reference.solution(lotka_volterra, y0, 0.0, ts, args)
    error = lambda ys: reference.max_abs_error(ys, ys_ref)
    return [Case("W1", "W1", (args,), tuple(entries), error, "max |ys - ys_ref|")]


def _w2_cases(size, peers: dict) -> list[Case]:
    ts, y0, args = _lv_problem()

    make = lambda lib: _gradient(functools.partial(_lv_solve, lib, ts, y0), sum_of_squares)
    entries = _with_each_api(peers, make)
    if "jax.experimental.ode" in peers:
        odeint = functools.partial(odeint_solve, peers["jax.experimental.ode"], lotka_volterra)
        loss = lambda a: sum_of_squares(odeint(y0, ts, a, rtol=1e-8, atol=1e-8))
        grad = lambda a: (jax.grad(loss)(a), None)
        entries.append(Entry("jax.experimental.ode (Dopri5, backsolve)", lambda rows: grad))
    entries += _torch_entries(
        peers, "lotka_volterra_entries", ts, y0, args, gradient=True, tolerance=1e-8, dt0=0.01
    )
    grad_ref = reference.sensitivity_gradient(lotka_volterra, y0, 0.0, ts, args, sum_of_squares)
    error = lambda g: reference.max_rel_error(g, grad_ref)
    return [Case("W2", "W2", (args,), tuple(entries), error, "max rel. error of the gradient")]


# --- W3, W6: neural ODE, batched by vmap, float32 -----------------------------------------


# W3 and W6 share their problem, functions and reference per batch size (cached for the
# process): at the same batch, W6's gradient is W3's function on W3's inputs, so a run
# compiles it once (quick mode on CPU sizes W6 so).


@functools.cache
def _neural_problem(batch: int):
    """(params, field, y0s, ts): an MLP field and `batch` initial states, fixed key."""
    key_mlp, key_y0 = jax.random.split(jax.random.key(0))
    params, field = neural_field(key_mlp, F32)
    y0s = jax.random.normal(key_y0, (batch, 2), F32)
    return params, field, y0s, jnp.linspace(0.0, 1.0, 20, dtype=F32)


def _neural_solve_one(lib, field, ts, params, y0, reversible: bool = False):
    """One sample's solve; `reversible`: odesolve's `Reversible(Tsit5())` differentiated
    by `ReversibleAdjoint` (else Tsit5 and the library's default adjoint)."""
    solver, extra = lib.Tsit5(), {}
    if reversible:
        solver, extra = lib.Reversible(solver), dict(adjoint=lib.ReversibleAdjoint())
    return lib.diffeqsolve(
        lib.ODETerm(field),
        solver,
        ts[0],
        ts[-1],
        ts[1] - ts[0],
        y0,
        params,
        saveat=lib.SaveAt(ts=ts),
        stepsize_controller=lib.PIDController(rtol=1e-6, atol=1e-6),
        **extra,
    )


def _neural_solve(lib, field, ts, params, y0s, reversible: bool = False):
    """Every y0 in `y0s` solved by `vmap` (each keeps its own steps); (ys, num_steps)."""
    one = lambda y0: _neural_solve_one(lib, field, ts, params, y0, reversible)
    sol = jax.vmap(one)(y0s)
    return sol.ys, sol.stats["num_steps"]


def _neural_gradient(solve):
    """`(params, y0s) -> ((loss, d loss / d params), num_steps)` for loss = mean(ys**2)."""

    def loss(params, y0s):
        ys, steps = solve(params, y0s)
        return mean_of_squares(ys), steps

    def value_and_grad(params, y0s):
        (value, steps), grads = jax.value_and_grad(loss, has_aux=True)(params, y0s)
        return (value, grads), steps

    return value_and_grad


@functools.cache
def _neural_functions(lib, batch: int, reversible: bool = False) -> tuple:
    """(forward, value_and_grad) of the batched neural ODE solve with `lib`, made once."""
    _, field, _, ts = _neural_problem(batch)
    solve = functools.partial(_neural_solve, lib, field, ts, reversible=reversible)
    return solve, _neural_gradient(solve)


@functools.cache
def _neural_reference(batch: int) -> np.ndarray:
    """float64 scipy states of every solve at `ts`: (batch, len(ts), 2), as vmap lays out."""
    params, field, y0s, ts = _neural_problem(batch)
    batched = jax.vmap(field, in_axes=(None, 0, None))
    ys = reference.solution(batched, y0s, 0.0, ts, params, rtol=1e-12, atol=1e-12)
    return np.moveaxis(ys, 0, 1)


def _loss_error(loss_ref):
    """Error of a `((loss, grads), steps)` result: relative error of the loss."""
    return lambda out: reference.max_rel_error(out[0], loss_ref)


def _torch_neural(peers: dict, batch: int, gradient: bool, adjoint: bool = False) -> list:
    """The PyTorch peers' entries of W3/W6 (W3's MLP weights, tolerances and dt0)."""
    params, _, y0s, ts = _neural_problem(batch)
    kind = dict(gradient=gradient, adjoint=adjoint)
    dt0 = float(ts[1] - ts[0])
    return _torch_entries(peers, "neural_entries", params, y0s, ts, **kind, tolerance=1e-6, dt0=dt0)


def _w3_cases(batch: int, peers: dict) -> list[Case]:
    params, _, y0s, _ = _neural_problem(batch)
    entries = _with_each_api(peers, lambda lib: _neural_functions(lib, batch)[1])
    if "odesolve" in peers:
        reversible = lambda rows: _neural_functions(peers["odesolve"], batch, True)[1]
        entries.append(Entry("odesolve (reversible)", reversible, reversible_tsit5_evals))
    entries += _torch_neural(peers, batch, gradient=True, adjoint=True)
    error = _loss_error(mean_of_squares(_neural_reference(batch)))
    label = f"W3 B={batch}"
    return [Case("W3", label, (params, y0s), tuple(entries), error, "rel. error of the loss")]


# --- W3p: per-sample gradients, vmap(grad) with the MLP shared --------------------------


def _neural_sample_loss(lib, batch: int):
    """`(params, y0) -> (loss, num_steps)`: W3's loss of one sample's solve."""
    _, field, _, ts = _neural_problem(batch)

    def loss(params, y0):
        sol = _neural_solve_one(lib, field, ts, params, y0)
        return mean_of_squares(sol.ys), sol.stats["num_steps"]

    return loss


def _neural_per_sample(lib, batch: int):
    """`(params, y0s) -> (per-sample d loss_i / d params, num_steps)`, by
    `vmap(grad(loss_i), in_axes=(None, 0))`: the weights shared, one gradient per y0."""
    grad = jax.grad(_neural_sample_loss(lib, batch), has_aux=True)
    return jax.vmap(grad, in_axes=(None, 0))


@functools.cache
def _per_sample_reference(batch: int):
    """The same gradients one sample at a time, with odesolve's default adjoint under
    `lax.map` (a loop over the samples: no `vmap` anywhere)."""
    import odesolve as ode

    params, _, y0s, _ = _neural_problem(batch)
    grad = jax.grad(_neural_sample_loss(ode, batch), has_aux=True)
    one = lambda y0: grad(params, y0)[0]
    return jax.jit(lambda y0s: jax.lax.map(one, y0s))(y0s)


def _per_sample_error(batch: int):
    """Largest error, over weight arrays, of the per-sample gradients against one-at-a-time
    ones, relative to the largest entry of each array."""
    expected = _per_sample_reference(batch)

    def error(out):
        leaves = zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(expected))
        worst = lambda a, b: float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
        return max(worst(np.asarray(a, np.float64), np.asarray(b, np.float64)) for a, b in leaves)

    return error


def _w3p_cases(batch: int, peers: dict) -> list[Case]:
    params, _, y0s, _ = _neural_problem(batch)
    entries = _with_each_api(peers, lambda lib: _neural_per_sample(lib, batch))
    label = f"W3p B={batch}"
    error = _per_sample_error(batch)
    return [Case("W3p", label, (params, y0s), tuple(entries), error, "rel. error, per sample")]


# --- W4: long horizon, constant steps, memory -----------------------------------------


def _w4_solve(lib, n: int, adjoint, y0, args, solver=None):
    """W1's field on [0, 10] in n constant Tsit5 steps (or `solver`'s); (y(10) as a (1, 2)
    array, steps)."""
    sol = lib.diffeqsolve(
        lib.ODETerm(lotka_volterra),
        lib.Tsit5() if solver is None else solver,
        0.0,
        10.0,
        10.0 / n,
        y0,
        args,
        adjoint=adjoint,
        max_steps=n,
    )
    return sol.ys, sol.stats["num_steps"]


# W4's like-for-like memory row: the default adjoint given a budget below the memory of
# Diffrax's stored states (it then keeps nested segments; see adjoints/_schedule/nested.py).
W4_BUDGET = 16 * 2**10
W4_BUDGET_ROW = "odesolve (16 KiB budget)"
W4_REVERSIBLE_ROW = "odesolve (reversible, coupling=1)"


def diffrax_checkpoints(n: int) -> int:
    """States Diffrax's default adjoint keeps for n known steps: floor(-1.5 + sqrt(2n +
    0.25)) + 1 (diffrax/_adjoint.py); odesolve gets as many for a like-for-like memory row."""
    return int(np.floor(-1.5 + np.sqrt(2 * n + 0.25))) + 1


def _w4_case(n: int, peers: dict) -> Case:
    _, y0, args = _lv_problem()
    grad = lambda lib, adjoint: _gradient(
        functools.partial(_w4_solve, lib, n, adjoint, y0), sum_of_squares
    )
    entries = []
    if "odesolve" in peers:
        ode = peers["odesolve"]
        same = ode.RecursiveCheckpointAdjoint(checkpoints=diffrax_checkpoints(n))
        budget = ode.RecursiveCheckpointAdjoint(memory_budget=W4_BUDGET)
        tape = ode.RecursiveCheckpointAdjoint(memory_budget=2**30)
        entries.append(
            Entry("odesolve (same checkpoints)", lambda rows: grad(ode, same), tsit5_evals)
        )
        entries.append(Entry(W4_BUDGET_ROW, lambda rows: grad(ode, budget), tsit5_evals))
        entries.append(Entry("odesolve (tape)", lambda rows: grad(ode, tape), tsit5_evals))
        # coupling=1: the default 0.999 multiplies rounding errors by 0.999^-n when the
        # steps are undone, too much for 1e4 steps (benchmarks/reversible.py measures it).
        solver = ode.Reversible(ode.Tsit5(), coupling=1.0)
        undone = functools.partial(_w4_solve, ode, n, ode.ReversibleAdjoint(), y0, solver=solver)
        reversible = lambda rows: _gradient(undone, sum_of_squares)
        entries.append(Entry(W4_REVERSIBLE_ROW, reversible, reversible_tsit5_evals))
    if "diffrax" in peers:
        dfx = peers["diffrax"]
        adjoint = dfx.RecursiveCheckpointAdjoint()
        entries.append(Entry("diffrax", lambda rows: grad(dfx, adjoint), tsit5_evals))
    rk4 = lambda m: jax.grad(
        lambda a: sum_of_squares(fixed_step_solve(lotka_volterra, RK4, y0, 0.0, 10.0, m, a))
    )
    entries.append(_limit_entry("lax.scan RK4 (stores every step)", rk4, RK4, n))
    grad_ref = reference.sensitivity_gradient(
        lotka_volterra, y0, 0.0, (10.0,), args, sum_of_squares
    )
    error = lambda g: reference.max_rel_error(g, grad_ref)
    label = f"W4 n={n}"
    return Case("W4", label, (args,), tuple(entries), error, "max rel. error of the gradient")


def _w4_cases(sizes: tuple, peers: dict) -> list[Case]:
    return [_w4_case(n, peers) for n in sizes]


# --- W5: stiff, Robertson with Kvaerno5 ------------------------------------------------


# W5's tolerances, the same for every library: each is judged on the error it reaches at
# them (in units of the tolerance asked for) and the steps it takes there.
W5_TOLERANCES = dict(rtol=1e-8, atol=1e-10)


def _robertson_solve(lib, t1: float, y0, tolerances: dict, rates):
    """Robertson's equations to t1 with Kvaerno5; (y(t1) as a (1, 3) array, num_steps)."""
    sol = lib.diffeqsolve(
        lib.ODETerm(robertson),
        lib.Kvaerno5(),
        0.0,
        t1,
        1e-4,
        y0,
        rates,
        stepsize_controller=lib.PIDController(**tolerances),
    )
    return sol.ys, sol.stats["num_steps"]


def _w5_cases(t1: float, peers: dict) -> list[Case]:
    y0, rates = jnp.asarray(ROBERTSON_Y0, F64), jnp.asarray(ROBERTSON_RATES, F64)
    stiff: dict[str, Any] = dict(method="Radau", rtol=1e-12, atol=1e-16)
    solve = lambda lib, tol=W5_TOLERANCES: functools.partial(_robertson_solve, lib, t1, y0, tol)
    gradient_of = lambda lib, tol=W5_TOLERANCES: _gradient(solve(lib, tol), sum_of_squares)
    forward = _with_each_api(peers, solve, evals=None)
    gradient = _with_each_api(peers, gradient_of, None)
    y_ref = reference.solution(robertson, y0, 0.0, (t1,), rates, **stiff)
    grad_ref = reference.sensitivity_gradient(
        robertson, y0, 0.0, (t1,), rates, sum_of_squares, **stiff
    )
    forward_error = lambda ys: _in_tolerances(ys, y_ref, **W5_TOLERANCES)
    gradient_error = lambda g: reference.max_rel_error(g, grad_ref)
    forward_label = "max |y(t1) - ref| / (atol + rtol |ref|)"
    return [
        Case("W5", "W5 forward", (rates,), tuple(forward), forward_error, forward_label),
        Case("W5", "W5 gradient", (rates,), tuple(gradient), gradient_error, "max rel. error"),
    ]


def _in_tolerances(value, ref, rtol: float, atol: float) -> float:
    """The error in units of the tolerance asked for: 1 is exactly the accuracy asked."""
    value, ref = np.asarray(value, np.float64), np.asarray(ref, np.float64)
    return float(np.max(np.abs(value - ref) / (atol + rtol * np.abs(ref))))


# --- W6: ensemble throughput -----------------------------------------------------------


def _batched(field):
    """A field over a batch of states (one `lax.scan` serves the whole ensemble)."""
    return jax.vmap(field, in_axes=(None, 0, None))


def _w6_limit(tsit5: tuple, field, ts, differentiate: bool) -> Entry:
    """Fixed Tsit5 steps, as many as odesolve's slowest sample took, over the batch."""

    def solve_with_steps(n):
        final = lambda p, y: fixed_step_solve(_batched(field), tsit5, y, ts[0], ts[-1], n, p)
        if not differentiate:
            return final
        loss = lambda p, y: mean_of_squares(final(p, y))
        return lambda p, y: (loss(p, y), jax.grad(loss)(p, y))

    return _limit_entry("lax.scan Tsit5 (limit)", solve_with_steps, tsit5, "odesolve")


def _w6_cases(batch: int, peers: dict) -> list[Case]:
    params, field, y0s, ts = _neural_problem(batch)
    tsit5 = tableau_of(peers["odesolve"].Tsit5)
    forward = _with_each_api(peers, lambda lib: _neural_functions(lib, batch)[0])
    forward += _torch_neural(peers, batch, gradient=False)
    forward.append(_w6_limit(tsit5, field, ts, False))
    gradient = _with_each_api(peers, lambda lib: _neural_functions(lib, batch)[1])
    gradient += _torch_neural(peers, batch, gradient=True)
    gradient.append(_w6_limit(tsit5, field, ts, True))
    ys_ref = _neural_reference(batch)
    forward_error = lambda ys: reference.max_abs_error(ys, ys_ref)
    inputs = (params, y0s)
    return [
        Case(
            "W6",
            f"W6 forward B={batch}",
            inputs,
            tuple(forward),
            forward_error,
            "max |ys - ys_ref|",
            batch,
        ),
        Case(
            "W6",
            f"W6 gradient B={batch}",
            inputs,
            tuple(gradient),
            _loss_error(mean_of_squares(ys_ref)),
            "rel. error of the loss",
            batch,
        ),
    ]


# --- W7: compile time, from W2's and W3's rows ------------------------------------------


_COMPILE_ONLY = dict(run_ms=None, solves_per_s=None, error=None, error_of=None, temp_bytes=None)


def _w7_rows(rows: list[dict]) -> list[dict]:
    """Compile-time rows of W2 and W3: the ratio is of compile times. Eager (PyTorch) rows
    are left out: they compile nothing, and their first-call overhead is not a compile."""
    derived = [
        dict(row, workload="W7", case=f"W7 compile {row['case']}", **_COMPILE_ONLY)
        for row in rows
        if row["workload"] in ("W2", "W3") and row["compiled"]
    ]
    return add_ratios(derived, key="compile_s")


# --- targets (ratio odesolve / diffrax, lower is better) ---------------------------------


def _row(rows: list[dict], case: str, library: str) -> dict | None:
    return next((r for r in rows if r["case"] == case and r["library"] == library), None)


def _cases(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(row["case"] for row in rows))


def _ratio_at_most(limit: float, library: str = "odesolve"):
    """Met when `library`'s ratio is at most `limit` in every case."""

    def check(rows):
        found = [(r["case"], r["ratio"]) for r in rows if r["library"] == library]
        found = [(case, ratio) for case, ratio in found if ratio is not None]
        if not found:
            return None, "no ratio (Diffrax not measured)"
        detail = ", ".join(f"{case}: {ratio:.2f}" for case, ratio in found)
        return all(ratio <= limit for _, ratio in found), detail

    return check


def _all_met(results: list[tuple]) -> tuple[bool | None, str]:
    """Combine per-case (met, detail) pairs: unknown if any is unknown."""
    if not results:
        return None, "nothing measured"
    mets = [met for met, _ in results]
    met = None if None in mets else all(mets)
    return met, "; ".join(detail for _, detail in results)


def _w4_case_check(rows, case):
    budget, tape = (_row(rows, case, W4_BUDGET_ROW), _row(rows, case, "odesolve (tape)"))
    diffrax, scan = (
        _row(rows, case, "diffrax"),
        _row(rows, case, "lax.scan RK4 (stores every step)"),
    )
    if budget is None or tape is None or diffrax is None or scan is None:
        return None, f"{case}: rows missing"
    temp, diffrax_temp = budget["temp_bytes"], diffrax["temp_bytes"]
    memory_ok = temp is not None and temp <= diffrax_temp
    tape_vs_scan = tape["run_ms"] / scan["run_ms"]
    met = budget["ratio"] <= 0.3 and memory_ok and tape_vs_scan <= 1.5
    detail = (
        f"{case}: {budget['ratio']:.2f}, temp {temp} vs {diffrax_temp} B, "
        f"tape/scan {tape_vs_scan:.2f}"
    )
    return met, detail


def _w6_case_check(rows, case):
    ours, diffrax = _row(rows, case, "odesolve"), _row(rows, case, "diffrax")
    limit = _row(rows, case, "lax.scan Tsit5 (limit)")
    if ours is None or diffrax is None or limit is None:
        return None, f"{case}: rows missing"
    speedup = diffrax["run_ms"] / ours["run_ms"]
    to_limit = ours["run_ms"] / limit["run_ms"]
    detail = f"{case}: {speedup:.2f}x diffrax's solves/s, {to_limit:.1f}x the scan's time"
    return speedup >= 1.5 and to_limit <= 3.0, detail


# The forward error, in units of the tolerance, that still honours it (a global error over
# 40 time units may sum a few steps' local errors).
W5_HONOURED = 3.0


def _w5_case_check(rows, case):
    """odesolve's ratio at most 0.5 at the tolerances Diffrax solves to, with an error
    no larger than Diffrax's (both shown); the forward solve must also honour the
    tolerance (error <= W5_HONOURED in units of it)."""
    diffrax, ours = _row(rows, case, "diffrax"), _row(rows, case, "odesolve")
    if diffrax is None or ours is None or ours["error"] is None:
        return None, f"{case}: no Diffrax or odesolve row"
    detail = (
        f"{case}: {ours['ratio']:.2f}, error {ours['error']:.1e} vs Diffrax's "
        f"{diffrax['error']:.1e} at the same tolerances"
    )
    honoured = case != "W5 forward" or ours["error"] <= W5_HONOURED
    as_accurate = diffrax["error"] is None or ours["error"] <= diffrax["error"]
    return ours["ratio"] <= 0.5 and honoured and as_accurate, detail


def _per_case(case_check):
    return lambda rows: _all_met([case_check(rows, case) for case in _cases(rows)])


def _w3_check(rows):
    """odesolve's ratio at most 0.6, and faster than torchode where it was measured."""
    met, detail = _ratio_at_most(0.6)(rows)
    ours = [r for r in rows if r["library"] == "odesolve"]
    torchode = [r for r in rows if r["library"].startswith("torchode")]
    if not (ours and torchode):
        return met, detail + " (torchode: not measured)"
    speedup = torchode[0]["run_ms"] / ours[0]["run_ms"]
    both = None if met is None else met and speedup > 1.0
    return both, detail + f"; torchode's time / odesolve's {speedup:.2f}"


# --- the registry --------------------------------------------------------------------

WORKLOADS = {
    w.id: w
    for w in (
        Workload(
            "W1",
            "Lotka-Volterra forward, Tsit5, PID 1e-8, 200 saves",
            "float64",
            "",
            sizes=dict(smoke=None, quick=None, full=None),
            cases=_w1_cases,
            target=Target("<= 0.3", _ratio_at_most(0.3), 0.3),
        ),
        Workload(
            "W2",
            "gradient of W1 (default adjoint)",
            "float64",
            "(a, b, c, d)",
            sizes=dict(smoke=None, quick=None, full=None),
            cases=_w2_cases,
            target=Target("<= 0.2", _ratio_at_most(0.2), 0.2),
        ),
        Workload(
            "W3",
            "neural ODE training step, MLP 2-64-64-2, vmap batch",
            "float32",
            "the MLP",
            sizes=dict(smoke=8, quick=256, full=256),
            cases=_w3_cases,
            target=Target("<= 0.6, and faster than torchode", _w3_check, 0.6),
        ),
        Workload(
            "W3p",
            "per-sample gradients vmap(grad) of W3's loss, MLP shared",
            "float32",
            "the MLP, per sample",
            sizes=dict(smoke=8, quick=256, full=256),
            cases=_w3p_cases,
            target=Target("<= 0.7", _ratio_at_most(0.7), 0.7),
        ),
        Workload(
            "W4",
            "long-horizon gradient, constant Tsit5 steps",
            "float64",
            "(a, b, c, d)",
            # Quick: one size (each size compiles four gradients anew).
            sizes=dict(smoke=(100,), quick=(10_000,), full=(1_000, 10_000, 100_000)),
            cases=_w4_cases,
            target=Target(
                "<= 0.3 at <= diffrax's temp memory; tape within 1.5x of the scan",
                _per_case(_w4_case_check),
                0.3,
            ),
        ),
        Workload(
            "W5",
            "stiff Robertson to t=40, Kvaerno5, forward and gradient",
            "float64",
            "(k1, k2, k3)",
            sizes=dict(smoke=40.0, quick=40.0, full=40.0),
            cases=_w5_cases,
            target=Target("<= 0.5 at Diffrax's accuracy or better", _per_case(_w5_case_check), 0.5),
            requires=("Kvaerno5",),
        ),
        Workload(
            "W6",
            "ensemble of W3's field, forward and gradient",
            "float32",
            "the MLP",
            # Quick on CPU: W3's batch, so the gradient case reuses W3's executables (the
            # stated 2^10 is --full); smoke likewise.
            sizes=dict(smoke=8, quick=256, full=2**10),
            cases=_w6_cases,
            gpu_sizes=dict(quick=2**14, full=2**14),
            target=Target(
                ">= 1.5x diffrax's solves/s; within 3x of the scan",
                _per_case(_w6_case_check),
                1 / 1.5,
            ),
        ),
        Workload(
            "W7",
            "compile time of W2 and W3",
            "",
            "",
            sizes=dict(smoke=None, quick=None, full=None),
            target=Target("<= 0.5", _ratio_at_most(0.5), 0.5),
            derive=_w7_rows,
            needs=("W2", "W3"),
        ),
    )
}

# Workloads in modules of their own (they use the helpers above) register here.
from ._w10 import W10  # noqa: E402
from ._w11 import W11  # noqa: E402
from ._w12 import W12  # noqa: E402

WORKLOADS[W10.id] = W10
WORKLOADS[W11.id] = W11
WORKLOADS[W12.id] = W12
from ._real_code import W2s, W8, W9  # noqa: E402

for _workload in (W2s, W8, W9):
    WORKLOADS[_workload.id] = _workload
from ._wp import WP  # noqa: E402

WORKLOADS[WP.id] = WP
