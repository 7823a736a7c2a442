"""`DirectAdjoint`'s reverse mode against `max_steps`, against Diffrax in one process.

The solve takes about 40 steps (y' = -k y, Tsit5, PID 1e-8); `max_steps` is the bound the
direct adjoint's scans run up to. Prints the median time of the compiled gradient for
dense output (`sol.evaluate` at 6 times) and for the final state (`SaveAt(t1=True)`), and
for the final state of 32 solves under `vmap` (k from 0.5 to 2, each sample's gradient).

    python benchmarks/direct_adjoint.py
"""

import time

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

import odesolve

jax.config.update("jax_enable_x64", True)
TS = jnp.linspace(0.0, 2.0, 6)


def gradient(lib, dense: bool, max_steps: int, batched: bool = False):
    def loss(k):
        sol = lib.diffeqsolve(
            lib.ODETerm(lambda t, y, a: -a * y), lib.Tsit5(), 0.0, 2.0, 0.05, jnp.array([1.0]),
            args=k, saveat=lib.SaveAt(dense=True) if dense else lib.SaveAt(t1=True),
            stepsize_controller=lib.PIDController(rtol=1e-8, atol=1e-8),
            adjoint=lib.DirectAdjoint(), max_steps=max_steps,
        )  # fmt: skip
        return jnp.sum(jax.vmap(sol.evaluate)(TS) ** 2) if dense else jnp.sum(sol.ys**2)

    return jax.jit(jax.vmap(jax.grad(loss)) if batched else jax.grad(loss))


def median_ms(fn, rounds: int = 7, k=0.5) -> float:
    jax.block_until_ready(fn(k))
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        jax.block_until_ready(fn(k))
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


if __name__ == "__main__":
    for dense in (True, False):
        for max_steps in (256, 1024, 4096, 16384):
            ours = median_ms(gradient(odesolve, dense, max_steps))
            theirs = median_ms(gradient(diffrax, dense, max_steps))
            print(
                f"{'dense' if dense else 't1':5s} max_steps={max_steps:6d}  odesolve {ours:8.2f} ms"
                f"  diffrax {theirs:8.2f} ms  ratio {ours / theirs:.2f}",
                flush=True,
            )
    ks = jnp.linspace(0.5, 2.0, 32)
    for max_steps in (256, 1024, 4096):
        ours = median_ms(gradient(odesolve, False, max_steps, True), k=ks)
        theirs = median_ms(gradient(diffrax, False, max_steps, True), k=ks)
        print(
            f"t1 x32 max_steps={max_steps:6d}  odesolve {ours:8.2f} ms"
            f"  diffrax {theirs:8.2f} ms  ratio {ours / theirs:.2f}",
            flush=True,
        )
