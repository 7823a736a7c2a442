"""Gradients of solves with a large state, against Diffrax in one process.

Two fields as users write them: a reaction-diffusion equation discretised on n points
(a few operations per point: cheap), and an MLP on a state of 8,192 (a 8,192 -> 256 ->
8,192 network: costly per point). Tsit5 with a PID controller, saved at 11 times, the
gradient of the sum of squares of the saved states. And a batch: 256 solves of a layer
tanh(A y) on a state of 64 under `vmap`, float32, saved at 20 times, the weights shared.
Prints steps, each library's median time over interleaved calls, the ratio and the
largest relative difference between the two gradients.

    python benchmarks/large_state.py            # n = 200, 2,000 and 20,000, the MLP, the batch
    python benchmarks/large_state.py 2000       # one size of the reaction-diffusion field
    python benchmarks/large_state.py batch mlp  # the batch, then the MLP
"""

import sys

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
from _interleaved import medians

import odesolve

jax.config.update("jax_enable_x64", True)


def reaction_diffusion(n: int):
    """(field, y0, args, t1, tolerances) on n points of [0, 1], periodic."""
    x = jnp.linspace(0.0, 1.0, n)
    dx = x[1] - x[0]

    def field(t, y, args):
        d, r = args
        laplacian = (jnp.roll(y, 1) - 2 * y + jnp.roll(y, -1)) / dx**2
        return d * laplacian + r * y * (1 - y)

    args = (jnp.asarray(1e-3 * (n / 2000) ** -2), jnp.asarray(1.0))
    return field, jnp.exp(-100 * (x - 0.5) ** 2), args, 0.1, (1e-6, 1e-8)


def mlp_field(n: int = 8192, width: int = 256):
    keys = jax.random.split(jax.random.key(0), 3)
    w1 = jax.random.normal(keys[0], (width, n)) / np.sqrt(n)
    w2 = jax.random.normal(keys[1], (n, width)) / np.sqrt(width)
    field = lambda t, y, p: p[1] @ jnp.tanh(p[0] @ y) - y
    return field, jax.random.normal(keys[2], (n,)), (w1, w2), 1.0, (1e-9, 1e-9)


def batched_layer(n: int = 64, batch: int = 256):
    """A layer tanh(A y) on a state of `n`, `batch` initial states (solved by `vmap`),
    float32 (a 2-D `y0` is a batch: see `gradient`)."""
    keys = jax.random.split(jax.random.key(0), 2)
    scale = jnp.float32(n**-0.5)
    a = scale * jax.random.normal(keys[0], (n, n), jnp.float32) - 2 * jnp.eye(n, dtype=jnp.float32)
    y0s = jax.random.normal(keys[1], (batch, n), jnp.float32)
    return lambda t, y, a: jnp.tanh(a @ y), y0s, a, 1.0, (1e-6, 1e-6)


def gradient(lib, field, y0, t1, tolerances):
    rtol, atol = tolerances
    # The batch as a training loop writes it: Diffrax's default max_steps.
    saves, dt0, max_steps = (20, 0.05, 4096) if y0.ndim == 2 else (11, 1e-4, 100_000)

    def solve(args, y0):
        sol = lib.diffeqsolve(
            lib.ODETerm(field), lib.Tsit5(), 0.0, t1, dt0, y0, args,
            stepsize_controller=lib.PIDController(rtol=rtol, atol=atol),
            saveat=lib.SaveAt(ts=jnp.linspace(0.0, t1, saves, dtype=y0.dtype)),
            max_steps=max_steps,
        )  # fmt: skip
        return jnp.sum(sol.ys**2), sol.stats["num_steps"]

    def loss(args):
        if y0.ndim == 1:
            return solve(args, y0)
        values, steps = jax.vmap(solve, in_axes=(None, 0))(args, y0)
        return jnp.sum(values), jnp.max(steps)

    return jax.jit(jax.grad(loss, has_aux=True))


def compare(label: str, problem, rounds: int = 5) -> None:
    field, y0, args, t1, tolerances = problem
    fns = {lib.__name__: gradient(lib, field, y0, t1, tolerances) for lib in (odesolve, diffrax)}
    out, times = medians(fns, args, rounds)
    ours, theirs = times["odesolve"], times["diffrax"]
    pairs = zip(jax.tree.leaves(out["odesolve"][0]), jax.tree.leaves(out["diffrax"][0]))
    diff = max(float(jnp.max(jnp.abs(a - b) / jnp.max(jnp.abs(b)))) for a, b in pairs)
    print(
        f"{label:28s} steps {int(out['odesolve'][1])} / {int(out['diffrax'][1])}"
        f"  odesolve {ours * 1e3:8.1f} ms  diffrax {theirs * 1e3:8.1f} ms"
        f"  ratio {ours / theirs:.2f}  gradient difference {diff:.1e}",
        flush=True,
    )


if __name__ == "__main__":
    chosen = sys.argv[1:] or ["200", "2000", "20000", "mlp", "batch"]
    for name in chosen:
        if name == "mlp":
            compare("MLP field, n=8192", mlp_field())
        elif name == "batch":
            compare("256 x tanh(A y), n=64", batched_layer())
        else:
            compare(f"reaction-diffusion n={name}", reaction_diffusion(int(name)))
