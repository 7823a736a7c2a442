"""W12: a solve inside the user's own `lax.scan` body. An ODE-RNN encoder, as written for
irregularly sampled series: a scan over 20 observations, where the hidden state evolves
between observations by a short `diffeqsolve` of an MLP field and is then updated by a
GRU cell; `vmap` over the series outside the scan; `value_and_grad` of mean(h**2).

Reverse mode through the user's scan keeps every iteration's residuals, stacked, so what
the default adjoint keeps for one solve is paid once per observation (and, under a `vmap`
of the scan, which no solve can see, once per series). The row "odesolve (64 KiB
budget)" is the adjoint the adjoints page recommends there.
"""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from . import _reference as reference
from ._real_code import _entries, _loss_error, _value_and_grad
from ._spec import Case, Entry, Target, Workload

F32, F64 = jnp.float32, jnp.float64
HIDDEN, OBSERVATIONS, FEATURES = 32, 20, 3
# Each solve covers this much time between two observations, from a first step of DT0.
SPAN, DT0, RTOL, ATOL = 0.5, 0.1, 1e-4, 1e-5
BUDGET = 64 * 2**10
BUDGET_ROW = "odesolve (64 KiB budget)"


@functools.cache
def _problem(batch: int):
    """(params, static, xs): the MLP field and GRU cell, and `batch` series of
    observations."""
    k_mlp, k_cell, k_xs = jax.random.split(jax.random.key(12), 3)
    mlp = eqx.nn.MLP(
        HIDDEN, HIDDEN, 64, 2, activation=jax.nn.softplus, final_activation=jnp.tanh,
        dtype=F32, key=k_mlp,
    )  # fmt: skip
    cell = eqx.nn.GRUCell(FEATURES, HIDDEN, dtype=F32, key=k_cell)
    params, static = eqx.partition((mlp, cell), eqx.is_array)
    xs = jax.random.normal(k_xs, (batch, OBSERVATIONS, FEATURES), F32)
    return params, static, xs


def _step(lib, static, adjoint=None):
    """The encoder's training step with `lib` (and `adjoint`, where given)."""
    extra = {} if adjoint is None else dict(adjoint=adjoint)

    def encode(params, x):
        mlp, cell = eqx.combine(params, static)

        # float32 times: under jax_enable_x64, Diffrax promotes a float32 state to the
        # dtype of times given as Python floats.
        t0, t1, dt0 = (jnp.asarray(t, F32) for t in (0.0, SPAN, DT0))

        def observe(h, x_t):
            sol = lib.diffeqsolve(
                lib.ODETerm(lambda t, y, mlp: mlp(y)), lib.Tsit5(), t0, t1, dt0, h, mlp,
                stepsize_controller=lib.PIDController(rtol=RTOL, atol=ATOL), **extra,
            )  # fmt: skip
            return cell(x_t, sol.ys[-1]), sol.stats["num_steps"]

        h, steps = jax.lax.scan(observe, jnp.zeros(HIDDEN, F32), x)
        return h, jnp.max(steps)

    def loss(params, xs):
        hs, steps = jax.vmap(lambda x: encode(params, x))(xs)
        return jnp.mean(hs**2), steps

    return _value_and_grad(loss)


def _loss_reference(batch: int) -> float:
    """mean(h**2) in float64: each gap solved by scipy at 1e-10 for all series as one
    system, then the GRU cell applied."""
    params, static, xs = _problem(batch)
    mlp, cell = eqx.combine(jax.tree_util.tree_map(lambda a: jnp.asarray(a, F64), params), static)
    field = lambda t, h, args: jax.vmap(mlp)(h)
    h = np.zeros((batch, HIDDEN))
    for k in range(OBSERVATIONS):
        h = reference.solution(field, h, 0.0, np.array([SPAN]), None, rtol=1e-10, atol=1e-10)[-1]
        h = np.asarray(jax.vmap(cell)(jnp.asarray(xs[:, k], F64), jnp.asarray(h)))
    return float(np.mean(h**2))


def cases(batch: int, peers: dict) -> list[Case]:
    params, static, xs = _problem(batch)
    entries = list(_entries(peers, lambda lib: _step(lib, static)))
    if "odesolve" in peers:
        ode = peers["odesolve"]
        budget = ode.RecursiveCheckpointAdjoint(memory_budget=BUDGET)
        build = lambda rows: _step(ode, static, budget)
        entries.append(Entry(BUDGET_ROW, build, entries[0].evals))
    error = _loss_error(_loss_reference(batch))
    label = f"W12 B={batch}"
    return [Case("W12", label, (params, xs), tuple(entries), error, "rel. error of the loss")]


def _check(rows: list[dict]) -> tuple[bool | None, str]:
    found = {r["library"]: r["ratio"] for r in rows if r["ratio"] is not None}
    if "odesolve" not in found:
        return None, "no ratio (Diffrax not measured)"
    detail = ", ".join(f"{library}: {ratio:.2f}" for library, ratio in found.items())
    return found["odesolve"] <= 1.0, detail


W12: Workload = Workload(
    "W12",
    "ODE-RNN encoder: a diffeqsolve inside the user's lax.scan over 20 observations",
    "float32",
    "the MLP and GRU cell",
    sizes=dict(smoke=2, quick=32, full=32),
    cases=cases,
    target=Target("<= 1.0 with the default adjoint", _check, 1.0),
)
