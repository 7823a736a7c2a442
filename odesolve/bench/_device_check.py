"""Correctness on an accelerator: the same solves and gradients run on the default device
(a GPU) and on the CPU backend, compared entry by entry.

Solves of float64 Lotka-Volterra and of W3's float32 neural field, each: the forward
states, `grad` of a loss, `vmap(grad)` with the parameters shared, and `grad` of a loss of
a `vmap`ped solve. The two backends round differently (fused multiply-adds, reduction
order), and an adaptive solve may then accept a step on one and reject it on the other,
so results agree to within the solves' tolerance, not bit for bit: the bound is a
multiple of it, far below any real fault (a wrong stage, a lost cotangent).
"""

import dataclasses
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ._problems import LOTKA_VOLTERRA_RATES, lotka_volterra, neural_field

# Largest relative difference allowed between backends, per dtype (solved at rtol 1e-8
# in float64 and 1e-6 in float32): a step accepted on one backend and rejected on the
# other moves a result by about the tolerance, times the problem's conditioning.
BOUNDS = {"float64": 1e-5, "float32": 1e-3}


@dataclasses.dataclass(frozen=True)
class Problem:
    """A batch of solves: `solve(params, y0) -> ys` for one sample, its parameters and a
    batch of initial states."""

    name: str
    dtype: str
    solve: Callable
    params: object
    y0s: jax.Array


def _lv_problem(ode, batch: int) -> Problem:
    ts = jnp.linspace(0.0, 10.0, 11, dtype=jnp.float64)

    def solve(rates, y0):
        sol = ode.diffeqsolve(
            ode.ODETerm(lotka_volterra),
            ode.Tsit5(),
            0.0,
            10.0,
            0.01,
            y0,
            rates,
            saveat=ode.SaveAt(ts=ts),
            stepsize_controller=ode.PIDController(rtol=1e-8, atol=1e-8),
        )
        return sol.ys

    rates = jnp.asarray(LOTKA_VOLTERRA_RATES, jnp.float64)
    y0s = 1.0 + 0.1 * jnp.arange(2 * batch, dtype=jnp.float64).reshape(batch, 2) / batch
    return Problem("Lotka-Volterra", "float64", solve, rates, y0s)


def _neural_problem(ode, batch: int) -> Problem:
    key_mlp, key_y0 = jax.random.split(jax.random.key(3))
    params, field = neural_field(key_mlp, jnp.float32)
    ts = jnp.linspace(0.0, 1.0, 5, dtype=jnp.float32)

    def solve(params, y0):
        sol = ode.diffeqsolve(
            ode.ODETerm(field),
            ode.Tsit5(),
            0.0,
            1.0,
            0.05,
            y0,
            params,
            saveat=ode.SaveAt(ts=ts),
            stepsize_controller=ode.PIDController(rtol=1e-6, atol=1e-6),
        )
        return sol.ys

    y0s = jax.random.normal(key_y0, (batch, 2), jnp.float32)
    return Problem("neural ODE", "float32", solve, params, y0s)


def problems(ode, batch: int) -> list[Problem]:
    return [_lv_problem(ode, batch), _neural_problem(ode, batch)]


def functions(problem: Problem) -> dict[str, Callable]:
    """`(params, y0s) -> result` for each transformation checked."""
    batched = jax.vmap(problem.solve, in_axes=(None, 0))
    loss = lambda params, y0: jnp.sum(problem.solve(params, y0) ** 2)
    batch_loss = lambda params, y0s: jnp.sum(batched(params, y0s) ** 2)
    return {
        "forward (vmap)": batched,
        "grad": lambda params, y0s: jax.grad(loss)(params, y0s[0]),
        "vmap(grad), parameters shared": jax.vmap(jax.grad(loss), in_axes=(None, 0)),
        "grad(vmap)": jax.grad(batch_loss),
    }


def relative_difference(result, expected) -> float:
    """Largest |result - expected| over every leaf, relative to that leaf's largest
    |expected| (NaN or a shape mismatch: infinity)."""
    worst = 0.0
    pairs = zip(jax.tree_util.tree_leaves(result), jax.tree_util.tree_leaves(expected))
    for a, b in pairs:
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a.shape != b.shape or not np.all(np.isfinite(a)):
            return float("inf")
        scale = max(float(np.max(np.abs(b), initial=0.0)), np.finfo(np.float64).tiny)
        worst = max(worst, float(np.max(np.abs(a - b), initial=0.0)) / scale)
    return worst


def _run_on(device, fn: Callable, inputs: tuple):
    """`fn` compiled for and run on `device`, its inputs placed there."""
    placed = jax.device_put(inputs, device)
    with jax.default_device(device):
        return jax.block_until_ready(jax.jit(fn)(*placed))


def _compare(problem: Problem, name: str, fn: Callable, log: Callable[[str], None]) -> dict:
    """`fn` on the default device against the CPU backend: one comparison's record."""
    device, cpu = jax.devices()[0], jax.devices("cpu")[0]
    start = time.perf_counter()
    inputs = (problem.params, problem.y0s)
    difference = relative_difference(_run_on(device, fn, inputs), _run_on(cpu, fn, inputs))
    bound = BOUNDS[problem.dtype]
    verdict = "ok" if difference <= bound else "DISAGREE"
    log(
        f"  check {problem.name} ({problem.dtype}) {name}: {device.platform} vs cpu "
        f"relative difference {difference:.2e} (bound {bound:.0e}) {verdict}"
    )
    return dict(
        problem=problem.name,
        dtype=problem.dtype,
        transformation=name,
        relative_difference=difference,
        bound=bound,
        ok=difference <= bound,
        seconds=round(time.perf_counter() - start, 2),
    )


def check(
    ode,
    batch: int,
    log: Callable[[str], None],
    only: tuple[str, ...] = (),
    deadline: float = float("inf"),
) -> list[dict]:
    """Every problem and transformation (those named in `only` as "problem: name" or
    "name", when given) on the default device and on the CPU: one dict per comparison,
    `ok` when within bound (None: not run, the `deadline` on `time.perf_counter()`
    having passed)."""
    results: list[dict] = []
    # Each transformation on both problems before the next, so that both dtypes are
    # checked when time runs out.
    pairs = [(p, name, fn) for p in problems(ode, batch) for name, fn in functions(p).items()]
    names = list(dict.fromkeys(name for _, name, _ in pairs))
    pairs.sort(key=lambda pair: names.index(pair[1]))
    for problem, name, fn in pairs:
        if only and name not in only and f"{problem.name}: {name}" not in only:
            continue
        if time.perf_counter() > deadline:
            log(f"  check {problem.name} ({problem.dtype}) {name}: not run (time is up)")
            skipped = dict(problem=problem.name, dtype=problem.dtype, transformation=name)
            results.append(dict(skipped, ok=None))
            continue
        results.append(_compare(problem, name, fn, log))
    return results


def _guarded(solve: Callable) -> str:
    """"none" when `solve()`, run a second time (compiled and cached by then), copies
    nothing from the device to the host; else the transfer JAX refused."""
    jax.block_until_ready(solve())
    try:
        with jax.transfer_guard_device_to_host("disallow"):
            jax.block_until_ready(solve())
    except Exception as error:  # JAX raises its own error type for a refused transfer
        return f"copied: {type(error).__name__}: {str(error)[:300]}"
    return "none"


def eager_host_copies(ode) -> dict[str, str]:
    """Whether a solve called outside `jit` (W3's field, its weights on the device)
    copies any array to the host, for two spellings: the final state only with
    `throw=False`, and save times on the device with the default `throw=True` (which
    reads the result code to raise). On the CPU the arrays are the host's, so nothing
    can be seen there."""
    if jax.default_backend() == "cpu":
        return {"all": "not observable on the CPU backend"}
    params, field = neural_field(jax.random.key(3), jnp.float32)
    y0 = jnp.ones(2, jnp.float32)

    def solve(saveat, throw: bool) -> Callable:
        return lambda: ode.diffeqsolve(
            ode.ODETerm(field),
            ode.Tsit5(),
            0.0,
            1.0,
            0.05,
            y0,
            params,
            saveat=saveat,
            stepsize_controller=ode.PIDController(rtol=1e-6, atol=1e-6),
            throw=throw,
        ).ys

    ts = ode.SaveAt(ts=jnp.linspace(0.0, 1.0, 5, dtype=jnp.float32))
    return {
        "SaveAt(t1=True), throw=False": _guarded(solve(ode.SaveAt(t1=True), False)),
        "SaveAt(ts=device array), throw=True": _guarded(solve(ts, True)),
    }
