"""Solves batched by `vmap` through inputs other than the state or `args`, against Diffrax
in one process.

- A field that closes over a per-sample value: `vmap(lambda x: diffeqsolve(ODETerm(
  lambda t, y, a: -x * tanh(a y)), ...))` over 256 values of x, the gradient in a;
- a neural CDE, as in Diffrax's example: each series' data interpolated by
  `CubicInterpolation` of `backward_hermite_coefficients`, a `ControlTerm` made an ODE,
  Tsit5 with a PID controller stepping to the observation times (`jump_ts`), 64 series
  by `vmap`; forward, and the gradient in the field's weights.

Prints each library's median time over interleaved calls, the ratio, the steps and the
largest relative difference between the outputs.

    python benchmarks/batched_inputs.py
"""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
from _interleaved import medians

import odesolve


def closure_gradient(lib):
    def loss(w, xs):
        def one(x):
            sol = lib.diffeqsolve(
                lib.ODETerm(lambda t, y, a: -x * jnp.tanh(a * y)), lib.Tsit5(), 0.0, 1.0, 0.1,
                jnp.ones(3), w, stepsize_controller=lib.PIDController(rtol=1e-6, atol=1e-6),
                saveat=lib.SaveAt(ts=jnp.linspace(0.0, 1.0, 5)),
            )  # fmt: skip
            return jnp.sum(sol.ys**2), sol.stats["num_steps"]

        values, steps = jax.vmap(one)(xs)
        return jnp.sum(values), steps

    grad = jax.jit(jax.grad(loss, has_aux=True))
    return lambda args: grad(*args)


def neural_cde(lib, gradient: bool):
    ts = jnp.linspace(0.0, 1.0, 50)
    data = jnp.stack([ts, jnp.sin(6 * ts), jnp.cos(4 * ts)], -1)
    series = data[None] * (1 + 0.1 * jnp.arange(64)[:, None, None] / 64)

    def one(weights, x):
        control = lib.CubicInterpolation(ts, lib.backward_hermite_coefficients(ts, x))
        field = lambda t, y, w: jnp.tanh(w @ y).reshape(8, 3)
        sol = lib.diffeqsolve(
            lib.ControlTerm(field, control).to_ode(), lib.Tsit5(), 0.0, 1.0, None,
            jnp.ones(8), weights,
            stepsize_controller=lib.PIDController(rtol=1e-3, atol=1e-6, jump_ts=ts),
            saveat=lib.SaveAt(t1=True),
        )  # fmt: skip
        return sol.ys[-1], sol.stats["num_steps"]

    def loss(weights):
        ys, steps = jax.vmap(lambda x: one(weights, x))(series)
        return jnp.mean(ys**2), steps

    return jax.jit(jax.grad(loss, has_aux=True) if gradient else loss)


def compare(label: str, make, args, rounds: int = 21) -> None:
    fns = {lib.__name__: make(lib) for lib in (odesolve, diffrax)}
    out, times = medians(fns, args, rounds)
    ours, theirs = times["odesolve"], times["diffrax"]
    steps = {k: int(np.max(v[1])) for k, v in out.items()}
    pairs = zip(jax.tree.leaves(out["odesolve"][0]), jax.tree.leaves(out["diffrax"][0]))
    diff = max(float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b))) for a, b in pairs)
    print(
        f"{label:36s} steps {steps['odesolve']} / {steps['diffrax']}"
        f"  odesolve {ours * 1e3:7.2f} ms  diffrax {theirs * 1e3:7.2f} ms"
        f"  ratio {ours / theirs:.2f}  difference {diff:.1e}",
        flush=True,
    )


if __name__ == "__main__":
    xs = jnp.linspace(0.5, 2.0, 256)
    compare("closure over x, 256 samples, grad", closure_gradient, (jnp.asarray(1.3), xs))
    weights = jax.random.normal(jax.random.key(9), (24, 8)) / 4
    compare("neural CDE, 64 series, forward", lambda lib: neural_cde(lib, False), weights)
    compare("neural CDE, 64 series, gradient", lambda lib: neural_cde(lib, True), weights)
