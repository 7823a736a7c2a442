"""Quick start: solve the Lotka-Volterra equations, check the result against a tight
reference solve, and plot the populations and the phase portrait to a PNG.

    python examples/quickstart.py [--out quickstart.png]
"""

import argparse

import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import odesolve as ode  # noqa: E402

jax.config.update("jax_enable_x64", True)


def lotka_volterra(t, y, args):
    """Prey x and predators z: dx = a x - b x z, dz = -c z + d x z."""
    a, b, c, d = args
    x, z = y
    return jnp.stack([a * x - b * x * z, -c * z + d * x * z])


@jax.jit
def solve(y0, args, ts, rtol):
    return ode.diffeqsolve(
        ode.ODETerm(lotka_volterra),
        ode.Tsit5(),
        t0=ts[0],
        t1=ts[-1],
        dt0=0.01,
        y0=y0,
        args=args,
        saveat=ode.SaveAt(ts=ts, dense=True),
        stepsize_controller=ode.PIDController(rtol=rtol, atol=rtol),
    )


def main(out: str) -> None:
    y0, args = jnp.array([1.0, 1.0]), jnp.array([1.5, 1.0, 3.0, 1.0])
    ts = jnp.linspace(0.0, 15.0, 300)
    sol = solve(y0, args, ts, 1e-8)
    reference = solve(y0, args, ts, 1e-12)
    error = float(jnp.max(jnp.abs(sol.ys - reference.ys)))
    print(
        f"steps: {int(sol.stats['num_steps'])} ({int(sol.stats['num_rejected_steps'])} "
        f"rejected); max error vs rtol=1e-12 solve: {error:.2e}"
    )
    print(f"y(7.3) from the dense interpolant: {sol.evaluate(7.3)}")

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(ts, sol.ys[:, 0], label="prey")
    left.plot(ts, sol.ys[:, 1], label="predators")
    left.set_xlabel("t")
    left.legend()
    right.plot(sol.ys[:, 0], sol.ys[:, 1])
    right.set_xlabel("prey")
    right.set_ylabel("predators")
    fig.suptitle("Lotka-Volterra, Tsit5 + PID (rtol=atol=1e-8)")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="quickstart.png")
    parser.add_argument("--quick", action="store_true", help="(same run; it is already quick)")
    main(parser.parse_args().out)
