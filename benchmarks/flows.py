"""Training steps of continuous normalising flows, against Diffrax in one process.

A flow's field returns (f(z, t), -divergence of f), f an MLP of (z, t) with softplus
activations; the divergence is the exact trace of f's Jacobian (by `jax.jacfwd` or
`jax.jacrev`) or Hutchinson's estimate with one noise vector per sample (`jax.vjp`).
Dopri5 with a PID controller at 1e-5, float32, the samples by `vmap`, and
`value_and_grad` of the mean negative log-likelihood under a standard normal base.
Prints each library's median time over interleaved calls, the ratio, XLA's temporary
memory, the steps and the largest relative difference between the two gradients.

    python benchmarks/flows.py                      # every flow below
    python benchmarks/flows.py jacfwd_d2_w64_B512   # one of them
"""

import sys
import time

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

import odesolve

# name: (state dimension, MLP width, divergence, batch)
FLOWS = {
    "jacfwd_d2_w64_B512": (2, 64, "jacfwd", 512),
    "jacrev_d2_w64_B512": (2, 64, "jacrev", 512),
    "hutchinson_d2_w64_B512": (2, 64, "hutchinson", 512),
    "jacfwd_d4_w128_B256": (4, 128, "jacfwd", 256),
    "jacfwd_d8_w64_B256": (8, 64, "jacfwd", 256),
    "jacfwd_d2_w32_B64": (2, 32, "jacfwd", 64),
}


def flow_field(dim: int, width: int, divergence: str):
    """(params, field): field(t, (z, delta), (params, noise)) -> (dz, d delta)."""
    mlp = eqx.nn.MLP(dim + 1, dim, width, 2, activation=jax.nn.softplus, key=jr.PRNGKey(0))
    params, static = eqx.partition(mlp, eqx.is_array)

    def field(t, state, args):
        z, _ = state
        p, noise = args
        f = lambda z: eqx.combine(p, static)(jnp.concatenate([z, jnp.reshape(t, (1,))]))
        if divergence == "jacfwd":
            return f(z), -jnp.trace(jax.jacfwd(f)(z))
        if divergence == "jacrev":
            return f(z), -jnp.trace(jax.jacrev(f)(z))
        fz, pullback = jax.vjp(f, z)
        return fz, -jnp.sum(pullback(noise)[0] * noise)

    return params, field


def training_step(lib, dim: int, width: int, divergence: str, batch: int):
    """(compiled value_and_grad, its inputs) with `lib` (odesolve or diffrax)."""
    params, field = flow_field(dim, width, divergence)
    xs = 0.7 * jr.normal(jr.PRNGKey(1), (batch, dim)) + 0.5
    noise = jr.normal(jr.PRNGKey(2), (batch, dim))

    def loss(params, xs, noise):
        def one(x, e):
            sol = lib.diffeqsolve(
                lib.ODETerm(field), lib.Dopri5(), 0.0, 1.0, 0.1, (x, jnp.zeros(())),
                (params, e), stepsize_controller=lib.PIDController(rtol=1e-5, atol=1e-5),
            )  # fmt: skip
            (z1,), (delta,) = sol.ys
            return 0.5 * jnp.sum(z1**2) + delta, sol.stats["num_steps"]

        nll, steps = jax.vmap(one)(xs, noise)
        return jnp.mean(nll), steps

    inputs = (params, xs, noise)
    step = jax.jit(jax.value_and_grad(loss, has_aux=True)).lower(*inputs).compile()
    return step, inputs


def compare(name: str, rounds: int = 11) -> None:
    steps, inputs = {}, None
    for lib in (odesolve, diffrax):
        steps[lib.__name__], inputs = training_step(lib, *FLOWS[name])
    outs = {k: step(*inputs) for k, step in steps.items()}
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(rounds):
        for k, step in steps.items():
            start = time.perf_counter()
            jax.block_until_ready(step(*inputs))
            times[k].append(time.perf_counter() - start)
    ms = {k: 1e3 * float(np.median(v)) for k, v in times.items()}
    temp = {k: step.memory_analysis().temp_size_in_bytes / 1e6 for k, step in steps.items()}
    grads = {k: jax.tree.leaves(out[1]) for k, out in outs.items()}
    difference = max(
        float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
        for a, b in zip(grads["odesolve"], grads["diffrax"])
    )
    taken = {k: int(out[0][1].max()) for k, out in outs.items()}
    print(
        f"{name:24s} odesolve {ms['odesolve']:7.1f} ms  diffrax {ms['diffrax']:7.1f} ms  "
        f"ratio {ms['odesolve'] / ms['diffrax']:.2f}  temp {temp['odesolve']:.0f} / "
        f"{temp['diffrax']:.0f} MB  steps {taken['odesolve']} / {taken['diffrax']}  "
        f"gradient difference {difference:.1e}",
        flush=True,
    )


if __name__ == "__main__":
    for name in sys.argv[1:] or FLOWS:
        compare(name)
