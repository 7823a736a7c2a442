"""Gradients of stiff solves, against Diffrax in one process and an independent reference.

Stiff problems as users write them, with Kvaerno5 and a PID controller and the generous
`max_steps` a stiff solve is given (so the default adjoint's budget holds tens of
thousands of states of a small state, and what a tick does with them shows):

- Van der Pol, mu = 1,000, from (2, 0): to t = 2 (a dozen steps, the start of the slow
  branch) and t = 3,000 (more than one relaxation cycle); the gradient of |y(t1)|^2 in mu;
- Robertson's chemical kinetics to t = 40, the gradients of |y(40)|^2 in the three rate
  constants of 32 perturbed systems under `vmap`.

Prints steps, each library's median time over interleaved calls, their ratio, and each
gradient's relative error against scipy's Radau at rtol = atol = 1e-12 on the forward
sensitivity equations (Van der Pol), or the relative difference between the libraries
(Robertson).

    python benchmarks/stiff.py
"""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
from _interleaved import medians
from scipy.integrate import solve_ivp

import odesolve

jax.config.update("jax_enable_x64", True)


def van_der_pol(t, y, mu):
    return jnp.stack([y[1], mu * (1 - y[0] ** 2) * y[1] - y[0]])


def van_der_pol_reference(mu: float, t1: float) -> float:
    """d|y(t1)|^2/dmu from the forward sensitivity equations (scipy Radau, 1e-12)."""

    def field(t, z):
        y0, y1, s0, s1 = z
        dy1 = mu * (1 - y0**2) * y1 - y0
        ds1 = (1 - y0**2) * y1 - 2 * mu * y0 * s0 * y1 + mu * (1 - y0**2) * s1 - s0
        return [y1, dy1, s1, ds1]

    def jacobian(t, z):
        y0, y1, s0, s1 = z
        a = mu * (1 - y0**2)
        return [
            [0, 1, 0, 0],
            [-2 * mu * y0 * y1 - 1, a, 0, 0],
            [0, 0, 0, 1],
            [-2 * y0 * y1 - 2 * mu * (s0 * y1 + y0 * s1), 1 - y0**2 - 2 * mu * y0 * s0,
             -2 * mu * y0 * y1 - 1, a],
        ]  # fmt: skip

    sol = solve_ivp(field, (0, t1), [2.0, 0, 0, 0], "Radau", rtol=1e-12, atol=1e-12, jac=jacobian)
    y0, y1, s0, s1 = sol.y[:, -1]
    return 2 * (y0 * s0 + y1 * s1)


def van_der_pol_gradient(lib, t1: float):
    def loss(mu):
        sol = lib.diffeqsolve(
            lib.ODETerm(van_der_pol), lib.Kvaerno5(), 0.0, t1, 1e-6, jnp.array([2.0, 0.0]), mu,
            stepsize_controller=lib.PIDController(rtol=1e-6, atol=1e-6),
            saveat=lib.SaveAt(t1=True), max_steps=100_000,
        )  # fmt: skip
        return jnp.sum(sol.ys**2), sol.stats["num_steps"]

    return jax.jit(jax.grad(loss, has_aux=True))


def robertson(t, y, k):
    y1, y2, y3 = y
    return jnp.stack(
        [
            -k[0] * y1 + k[2] * y2 * y3,
            k[0] * y1 - k[1] * y2**2 - k[2] * y2 * y3,
            k[1] * y2**2,
        ]
    )


def robertson_gradients(lib):
    def loss(k):
        sol = lib.diffeqsolve(
            lib.ODETerm(robertson), lib.Kvaerno5(), 0.0, 40.0, 1e-4, jnp.array([1.0, 0, 0]), k,
            stepsize_controller=lib.PIDController(rtol=1e-6, atol=1e-8),
            saveat=lib.SaveAt(ts=jnp.linspace(0.0, 40.0, 10)), max_steps=100_000,
        )  # fmt: skip
        return jnp.sum(sol.ys[-1] ** 2), sol.stats["num_steps"]

    return jax.jit(jax.vmap(jax.grad(loss, has_aux=True)))


def compare(label: str, make, args, reference=None, rounds: int = 9) -> None:
    fns = {lib.__name__: make(lib) for lib in (odesolve, diffrax)}
    out, times = medians(fns, args, rounds)
    ours, theirs = times["odesolve"], times["diffrax"]
    grads = {k: np.asarray(v[0]) for k, v in out.items()}
    steps = {k: int(np.max(v[1])) for k, v in out.items()}
    if reference is None:
        scale = np.max(np.abs(grads["diffrax"]))
        errors = f"difference {np.max(np.abs(grads['odesolve'] - grads['diffrax'])) / scale:.1e}"
    else:
        error = lambda g: float(np.max(np.abs(g - reference)) / abs(reference))
        errors = f"error {error(grads['odesolve']):.1e} / {error(grads['diffrax']):.1e}"
    print(
        f"{label:34s} steps {steps['odesolve']} / {steps['diffrax']}"
        f"  odesolve {ours * 1e3:8.2f} ms  diffrax {theirs * 1e3:8.2f} ms"
        f"  ratio {ours / theirs:.2f}  gradient {errors}",
        flush=True,
    )


if __name__ == "__main__":
    mu = jnp.asarray(1000.0)
    for t1 in (2.0, 3000.0):
        reference = van_der_pol_reference(1000.0, t1)
        make = lambda lib, t1=t1: van_der_pol_gradient(lib, t1)
        compare(f"Van der Pol mu=1e3 to t={t1:g}", make, mu, reference)
    key = jax.random.key(1)
    rates = jnp.array([0.04, 3e7, 1e4]) * jnp.exp(0.1 * jax.random.normal(key, (32, 3)))
    compare("Robertson x32 under vmap", robertson_gradients, rates)
