"""Gradients of solves with constant steps, against Diffrax in one process.

`diffeqsolve`'s default controller is `ConstantStepSize`: a solve written as
`diffeqsolve(term, Tsit5(), t0, t1, dt0, y0, saveat=SaveAt(ts=...))` takes a number of
steps known when traced, usually far fewer than `max_steps` (4,096 by default). Fields
as users write them:

- Lotka-Volterra, Tsit5, 1,000 steps, saved at 100 times (float64);
- an MLP field (16 -> 64 -> 64 -> 16, tanh), Tsit5, 20 steps: one trajectory saved at 20
  times; 128 trajectories under `vmap` saved at 20 times, and at t1 only;
- an MLP field (8 -> 64 -> 64 -> 8), Heun, 50 steps, 64 trajectories under `vmap` saved
  at 11 times, with the default adjoint and with `DirectAdjoint`.

Prints each library's median time over interleaved calls, their ratio and the largest
relative difference between the two gradients.

    python benchmarks/fixed_steps.py
"""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
from _interleaved import medians

import odesolve

jax.config.update("jax_enable_x64", True)


def lotka_volterra(t, y, a):
    x, z = y
    return jnp.stack([a[0] * x - a[1] * x * z, -a[2] * z + a[3] * x * z])


def lotka_volterra_gradient(lib):
    def loss(a):
        sol = lib.diffeqsolve(
            lib.ODETerm(lotka_volterra), lib.Tsit5(), 0.0, 10.0, 0.01, jnp.ones(2), a,
            saveat=lib.SaveAt(ts=jnp.linspace(0.0, 10.0, 100)),
        )  # fmt: skip
        return jnp.sum(sol.ys**2)

    return jax.jit(jax.grad(loss)), jnp.array([1.5, 1.0, 3.0, 1.0])


def neural_gradient(lib, *, size, batch, saves, solver="Tsit5", dt0=0.05, adjoint=None):
    """The gradient in an MLP field's weights of the mean square of the saved states
    (`saves` times on [0, 1], or t1 only for 0), of `batch` trajectories under `vmap`
    (0: one, unbatched)."""
    mlp = eqx.nn.MLP(size, size, 64, 2, activation=jnp.tanh, key=jax.random.key(0))
    weights, rest = eqx.partition(mlp, eqx.is_array)
    y0s = jax.random.normal(jax.random.key(1), (max(batch, 1), size))
    saveat = lib.SaveAt(ts=jnp.linspace(0.0, 1.0, saves)) if saves else lib.SaveAt(t1=True)
    options = {} if adjoint is None else {"adjoint": getattr(lib, adjoint)()}

    def loss(weights):
        field = eqx.combine(weights, rest)
        one = lambda y0: lib.diffeqsolve(
            lib.ODETerm(lambda t, y, a: field(y)), getattr(lib, solver)(), 0.0, 1.0, dt0, y0,
            saveat=saveat, **options,
        ).ys  # fmt: skip
        ys = jax.vmap(one)(y0s) if batch else one(y0s[0])
        return jnp.mean(ys**2)

    return jax.jit(jax.grad(loss)), weights


def compare(label: str, make, rounds: int = 9) -> None:
    (ours, args), (theirs, _) = make(odesolve), make(diffrax)
    out, times = medians({"odesolve": ours, "diffrax": theirs}, args, rounds)
    pairs = zip(jax.tree.leaves(out["odesolve"]), jax.tree.leaves(out["diffrax"]))
    diff = max(float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b))) for a, b in pairs)
    ours, theirs = times["odesolve"], times["diffrax"]
    print(
        f"{label:44s} odesolve {ours * 1e3:8.2f} ms  diffrax {theirs * 1e3:8.2f} ms"
        f"  ratio {ours / theirs:.2f}  gradient difference {diff:.1e}",
        flush=True,
    )


if __name__ == "__main__":
    neural = lambda **kw: lambda lib: neural_gradient(lib, **kw)
    compare("Lotka-Volterra, 1,000 steps, 100 saves", lotka_volterra_gradient)
    compare("MLP 16, 20 steps, 20 saves", neural(size=16, batch=0, saves=20))
    compare("MLP 16 x 128 (vmap), 20 steps, 20 saves", neural(size=16, batch=128, saves=20))
    compare("MLP 16 x 128 (vmap), 20 steps, t1", neural(size=16, batch=128, saves=0))
    heun = dict(size=8, batch=64, saves=11, solver="Heun", dt0=0.02)
    compare("MLP 8 x 64 (vmap), Heun, 50 steps, 11 saves", neural(**heun))
    compare("  the same with DirectAdjoint", neural(**heun, adjoint="DirectAdjoint"), rounds=3)
