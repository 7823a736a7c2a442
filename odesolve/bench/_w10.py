"""W10: an ensemble of small fields. Lorenz systems, each sample with its own parameters
and initial state, solved by `vmap` (benchmarks/README.md).

A small field's step is a few dozen floating-point operations, so what an adaptive solve
adds around it (error norm, controller, per-sample acceptance, the loop's condition) is
what costs; the limit is a fixed-step RK4 `lax.scan` taking, for every sample, as many
steps as odesolve's slowest sample took.
"""

import functools

import jax
import jax.numpy as jnp

from . import _reference as reference
from ._limit import RK4, fixed_step_solve, tableau_of
from ._spec import Case, Entry, Target, Workload
from ._workloads import _all_met, _cases, _limit_entry, _row, _with_each_api

F32 = jnp.float32
LORENZ_RATES = (10.0, 28.0, 8.0 / 3.0)  # (sigma, rho, beta)
T1 = 1.0
# The error is measured on the first samples only: a scipy reference of the whole
# ensemble (up to 2^18 samples on a GPU) would take longer than the bench.
REFERENCE_SAMPLES = 64
LIMIT_ROW = "lax.scan RK4 (limit)"
SAME_METHOD_ROW = "lax.scan Tsit5 (fixed steps)"


def lorenz(t, y, rates):
    """dx = sigma (y - x), dy = x (rho - z) - y, dz = x y - beta z."""
    sigma, rho, beta = rates[0], rates[1], rates[2]
    x, v, z = y[0], y[1], y[2]
    return jnp.stack([sigma * (v - x), x * (rho - z) - v, x * v - beta * z])


@functools.cache
def ensemble(batch: int) -> tuple:
    """(rates, y0s): per sample, (sigma, rho, beta) scaled by U(0.9, 1.1) and
    y0 = (1, 0, 0) + 0.1 N(0, 1); fixed keys, float32."""
    key_rates, key_y0 = jax.random.split(jax.random.key(10))
    scale = jax.random.uniform(key_rates, (batch, 3), F32, 0.9, 1.1)
    rates = jnp.asarray(LORENZ_RATES, F32) * scale
    y0s = jnp.asarray((1.0, 0.0, 0.0), F32) + 0.1 * jax.random.normal(key_y0, (batch, 3), F32)
    return rates, y0s


def ensemble_solve(lib, rates, y0s):
    """Every sample solved by `vmap` with `lib` (odesolve or Diffrax): (y(t1) per sample,
    num_steps per sample)."""

    def one(sample_rates, y0):
        sol = lib.diffeqsolve(
            lib.ODETerm(lorenz),
            lib.Tsit5(),
            0.0,
            T1,
            0.01,
            y0,
            sample_rates,
            saveat=lib.SaveAt(t1=True),
            stepsize_controller=lib.PIDController(rtol=1e-6, atol=1e-6),
        )
        return sol.ys, sol.stats["num_steps"]

    return jax.vmap(one)(rates, y0s)


def _fixed_step_entry(label: str, tableau: tuple) -> Entry:
    """`tableau`'s fixed steps over the whole batch at once, as many as odesolve's
    slowest sample took."""
    batched = jax.vmap(lorenz, in_axes=(None, 0, 0))
    solve = lambda n: lambda rates, y0s: fixed_step_solve(batched, tableau, y0s, 0.0, T1, n, rates)
    return _limit_entry(label, solve, tableau, "odesolve")


def _error(batch: int):
    """Largest |y(t1) - reference| over the first samples."""
    rates, y0s = ensemble(batch)
    count = min(batch, REFERENCE_SAMPLES)
    batched = jax.vmap(lorenz, in_axes=(None, 0, 0))
    ref = reference.solution(batched, y0s[:count], 0.0, (T1,), rates[:count])[0]
    return lambda ys: reference.max_abs_error(ys[:count, -1], ref)


def cases(batch: int, peers: dict, same_method: bool = True) -> list[Case]:
    """W10's one case at `batch` samples: odesolve, Diffrax, the RK4 limit and (unless
    `same_method` is False, as in a GPU's scaling sweep) Tsit5's fixed steps."""
    entries = _with_each_api(peers, lambda lib: functools.partial(ensemble_solve, lib))
    entries.append(_fixed_step_entry(LIMIT_ROW, RK4))
    if same_method:  # the same method without adaptivity: its stages' cost alone
        entries.append(_fixed_step_entry(SAME_METHOD_ROW, tableau_of(peers["odesolve"].Tsit5)))
    label, error = f"W10 B={batch}", _error(batch)
    return [Case("W10", label, ensemble(batch), tuple(entries), error, "max |y(t1) - ref|", batch)]


def _case_check(rows: list[dict], case: str) -> tuple[bool | None, str]:
    """Within 3x of the scan's time; Diffrax's solves/s beside it."""
    ours, limit = _row(rows, case, "odesolve"), _row(rows, case, LIMIT_ROW)
    if ours is None or limit is None:
        return None, f"{case}: rows missing"
    to_limit = ours["run_ms"] / limit["run_ms"]
    detail = f"{case}: {to_limit:.1f}x the scan's time"
    diffrax = _row(rows, case, "diffrax")
    if diffrax is not None:
        detail += f", {diffrax['run_ms'] / ours['run_ms']:.2f}x diffrax's solves/s"
    return to_limit <= 3.0, detail


W10: Workload = Workload(
    "W10",
    "small-field ensemble: Lorenz, per-sample parameters, vmap, forward",
    "float32",
    "",
    sizes=dict(smoke=8, quick=4096, full=4096),
    cases=cases,
    gpu_sizes=dict(quick=2**16, full=2**16),
    target=Target(
        "within 3x of the fixed-step RK4 scan",
        lambda rows: _all_met([_case_check(rows, case) for case in _cases(rows)]),
    ),
)
