"""Workloads from code written the way users write it (benchmarks/README.md, "Real code
is the yardstick"): W8, the training step of Diffrax's `latent_ode` example (a decoder
solve per series, each with its own traced save times, under `vmap`); W9, a continuous
normalising flow whose field returns its exact divergence by `jacfwd`; W2s, W2's gradient
with the Lotka-Volterra field written in four common ways.

Each is run against Diffrax in the same process, on the same inputs; the error is
against scipy in float64 (W8, W9: the loss; W2s: the gradient, by forward sensitivities).
"""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from . import _reference as reference
from ._spec import Case, Entry

F32, F64 = jnp.float32, jnp.float64
DIFFRAX_API = ("odesolve", "diffrax")


def _entries(peers: dict, make) -> tuple[Entry, ...]:
    """An entry for odesolve and Diffrax (when loaded), from `make(module) -> function`;
    `evals`: Tsit5's 6 new stages per step and 1 at the start."""
    evals = lambda steps: 6 * steps + 1
    return tuple(
        Entry(name, functools.partial(lambda module, rows: make(module), peers[name]), evals)
        for name in DIFFRAX_API
        if name in peers
    )


def _value_and_grad(loss):
    """`(params, *data) -> ((loss, d loss / d params), most steps of any sample)`."""

    def run(params, *data):
        (value, steps), grads = jax.value_and_grad(loss, has_aux=True)(params, *data)
        return (value, grads), jnp.max(steps)

    return run


def _loss_error(loss_ref: float):
    return lambda out: reference.max_rel_error(out[0], loss_ref)


# --- W8: latent-ODE decoder, per-sample traced save times ---------------------------------


class _LatentField(eqx.Module):
    """The `Func` of Diffrax's latent_ode example: scale * MLP(y)."""

    scale: jax.Array
    mlp: eqx.nn.MLP

    def __call__(self, t, y, args):
        return self.scale * self.mlp(y)


@functools.cache
def _latent_problem(batch: int):
    """(params, static, ts, y0s): the field's arrays, its static part, each series' 20
    sorted save times in [0, t1] with t1 in [2, 3], and the decoder's initial states."""
    k_mlp, k_t1, k_ts, k_y0 = jax.random.split(jax.random.key(8), 4)
    mlp = eqx.nn.MLP(
        16, 16, 16, 1, activation=jax.nn.softplus, final_activation=jnp.tanh, dtype=F32,
        key=k_mlp,
    )  # fmt: skip
    params, static = eqx.partition(_LatentField(jnp.ones((), F32), mlp), eqx.is_array)
    t1 = 2 + jax.random.uniform(k_t1, (batch,), F32)
    ts = jnp.sort(jax.random.uniform(k_ts, (batch, 20), F32) * t1[:, None], axis=1)
    y0s = jax.random.normal(k_y0, (batch, 16), F32)
    return params, static, ts, y0s


def _latent_step(lib, static):
    """The decoder's training step with `lib`: each series solved from its first save
    time to its last with constant steps of 0.4, as the example does."""

    def loss(params, ts, y0s):
        field = eqx.combine(params, static)

        def one(ts, y0):
            sol = lib.diffeqsolve(
                lib.ODETerm(field), lib.Tsit5(), ts[0], ts[-1], 0.4, y0,
                saveat=lib.SaveAt(ts=ts),
            )  # fmt: skip
            return sol.ys, sol.stats["num_steps"]

        ys, steps = jax.vmap(one)(ts, y0s)
        return jnp.mean(ys**2), steps

    return _value_and_grad(loss)


def _latent_reference(batch: int) -> float:
    """mean(ys**2) from scipy at 1e-12, all series as one system. The field does not
    read t, so each series is solved in the time since its first save time, and the
    system is sampled at every series' elapsed save times."""
    params, static, ts, y0s = _latent_problem(batch)
    field = eqx.combine(jax.tree_util.tree_map(lambda x: jnp.asarray(x, F64), params), static)
    elapsed = np.asarray(ts, np.float64) - np.asarray(ts, np.float64)[:, :1]
    times = np.unique(elapsed)
    batched = lambda t, y, args: jax.vmap(lambda y: field(t, y, args))(y)
    y0s = np.asarray(y0s, np.float64)
    ys = reference.solution(batched, y0s, 0.0, times, None, rtol=1e-12, atol=1e-12)
    rows = np.searchsorted(times, elapsed)  # (batch, 20) rows of `ys`
    per_series = ys[rows, np.arange(batch)[:, None]]  # (batch, 20, 16)
    return float(np.mean(per_series**2))


def latent_ode_cases(batch: int, peers: dict) -> list[Case]:
    params, static, ts, y0s = _latent_problem(batch)
    entries = _entries(peers, lambda lib: _latent_step(lib, static))
    error = _loss_error(_latent_reference(batch))
    label = f"W8 B={batch}"
    return [Case("W8", label, (params, ts, y0s), entries, error, "rel. error of the loss")]


# --- W9: continuous normalising flow, exact divergence by jacfwd --------------------------


@functools.cache
def _flow_problem(batch: int):
    """(params, static, xs): an MLP of (z, t) 3 -> 64 -> 64 -> 2 (tanh) and `batch`
    points of a two-component Gaussian mixture in the plane."""
    k_mlp, k_side, k_noise = jax.random.split(jax.random.key(9), 3)
    mlp = eqx.nn.MLP(3, 2, 64, 2, activation=jnp.tanh, dtype=F32, key=k_mlp)
    params, static = eqx.partition(mlp, eqx.is_array)
    side = jnp.where(jax.random.bernoulli(k_side, 0.5, (batch, 1)), 1.5, -1.5)
    xs = (side + 0.5 * jax.random.normal(k_noise, (batch, 2), F32)).astype(F32)
    return params, static, xs


def _flow_field(static):
    """The flow's field on (z, delta log p): (f(z, t), -trace(df/dz))."""

    def field(t, state, params):
        z, _ = state
        mlp = eqx.combine(params, static)
        f = lambda z: mlp(jnp.concatenate([z, jnp.reshape(t, (1,)).astype(z.dtype)]))
        return f(z), -jnp.trace(jax.jacfwd(f)(z))

    return field


def _flow_nll(z1, delta):
    """Negative log-likelihood under a standard normal base: -(log N(z1) - delta)."""
    log_base = -0.5 * jnp.sum(z1**2, axis=-1) - jnp.log(2 * jnp.pi)
    return jnp.mean(-(log_base - delta))


def _flow_step(lib, static):
    field = _flow_field(static)

    def loss(params, xs):
        def one(x):
            sol = lib.diffeqsolve(
                lib.ODETerm(field), lib.Tsit5(), jnp.zeros((), F32), jnp.ones((), F32), None,
                (x, jnp.zeros((), F32)),
                params, stepsize_controller=lib.PIDController(rtol=1e-5, atol=1e-5),
            )  # fmt: skip
            (z1,), (delta,) = sol.ys
            return z1, delta, sol.stats["num_steps"]

        z1, delta, steps = jax.vmap(one)(xs)
        return _flow_nll(z1, delta), steps

    return _value_and_grad(loss)


def _flow_reference(batch: int) -> float:
    """The loss from scipy at 1e-10 on the whole batch as one system, in float64."""
    params, static, xs = _flow_problem(batch)
    field = _flow_field(static)
    params64 = jax.tree_util.tree_map(lambda x: jnp.asarray(x, F64), params)

    def batched(t, y, args):
        z, delta = y[:, :2], y[:, 2]
        dz, ddelta = jax.vmap(lambda z: field(t, (z, 0.0), params64))(z)
        return jnp.concatenate([dz, ddelta[:, None]], axis=1)

    y0 = np.concatenate([np.asarray(xs, np.float64), np.zeros((batch, 1))], axis=1)
    ys = reference.solution(batched, y0, 0.0, np.array([1.0]), None, rtol=1e-10, atol=1e-10)
    return float(_flow_nll(ys[-1][:, :2], ys[-1][:, 2]))


def flow_cases(batch: int, peers: dict) -> list[Case]:
    params, static, xs = _flow_problem(batch)
    entries = _entries(peers, lambda lib: _flow_step(lib, static))
    error = _loss_error(_flow_reference(batch))
    label = f"W9 B={batch}"
    return [Case("W9", label, (params, xs), entries, error, "rel. error of the loss")]


# --- W2s: W2 with the field spelled four ways --------------------------------------------


def _unpack_state(t, y, p):
    x, z = y
    return jnp.stack([p[0] * x - p[1] * x * z, -p[2] * z + p[3] * x * z])


def _vector_form(t, y, p):
    linear = jnp.stack([p[0], -p[2]]) * y
    return linear + jnp.stack([-p[1], p[3]]) * y[0] * y[1]


def _index_twice(t, y, p):
    return jnp.stack(
        [p[0] * y[0] - p[1] * y[0] * y[1], -p[2] * y[1] + p[3] * y[0] * y[1]]
    )  # fmt: skip


def _unpack_args(t, y, args):
    a, b, c, d = args
    x, z = y[0], y[1]
    return jnp.stack([a * x - b * x * z, -c * z + d * x * z])


SPELLINGS = {
    "unpack state": _unpack_state,
    "vector form": _vector_form,
    "y[0] twice": _index_twice,
    "unpack args": _unpack_args,
}


def _lv_gradient(lib, field):
    ts = jnp.linspace(0.0, 50.0, 200, dtype=F64)
    y0 = jnp.asarray((1.0, 1.0), F64)

    def loss(args):
        sol = lib.diffeqsolve(
            lib.ODETerm(field), lib.Tsit5(), 0.0, 50.0, 0.01, y0, args,
            saveat=lib.SaveAt(ts=ts), max_steps=4096,
            stepsize_controller=lib.PIDController(rtol=1e-8, atol=1e-8),
        )  # fmt: skip
        return jnp.sum(sol.ys**2), sol.stats["num_steps"]

    return jax.grad(loss, has_aux=True)


@functools.cache
def _lv_reference() -> np.ndarray:
    ts = jnp.linspace(0.0, 50.0, 200, dtype=F64)
    y0, args = jnp.asarray((1.0, 1.0), F64), jnp.asarray((1.5, 1.0, 3.0, 1.0), F64)
    loss = lambda ys: jnp.sum(ys**2)
    return reference.sensitivity_gradient(_unpack_state, y0, 0.0, ts, args, loss)


def spelling_cases(size, peers: dict) -> list[Case]:
    args = jnp.asarray((1.5, 1.0, 3.0, 1.0), F64)
    error = lambda g: reference.max_rel_error(g, _lv_reference())
    cases = []
    for name, field in SPELLINGS.items():
        entries = _entries(peers, lambda lib, field=field: _lv_gradient(lib, field))
        label = f"W2s {name}"
        cases.append(Case("W2s", label, (args,), entries, error, "max rel. error of the gradient"))
    return cases


# --- the workloads ------------------------------------------------------------------------

# Imported here: `_workloads` registers these workloads at its end.
from ._spec import Target, Workload  # noqa: E402
from ._workloads import _ratio_at_most  # noqa: E402

W8: Workload = Workload(
    "W8",
    "latent-ODE decoder step: per-series traced save times under vmap, dt0=0.4",
    "float32",
    "the decoder's field",
    sizes=dict(smoke=8, quick=256, full=256),
    cases=latent_ode_cases,
    target=Target("<= 0.7", _ratio_at_most(0.7), 0.7),
)
W9: Workload = Workload(
    "W9",
    "continuous normalising flow step: exact divergence by jacfwd in the field",
    "float32",
    "the flow's MLP",
    sizes=dict(smoke=8, quick=512, full=512),
    cases=flow_cases,
    target=Target("<= 0.8", _ratio_at_most(0.8), 0.8),
)
W2s: Workload = Workload(
    "W2s",
    "W2 with the field spelled four ways (the worst counts)",
    "float64",
    "(a, b, c, d)",
    sizes=dict(smoke=None, quick=None, full=None),
    cases=spelling_cases,
    target=Target("<= 0.2 for every spelling", _ratio_at_most(0.2), 0.2),
)
