"""Robertson's stiff chemical kinetics with the implicit Kvaerno5 solver, on a log-time plot.

Three species react at rates spanning nine orders of magnitude:
    dy1/dt = -0.04 y1 + 1e4 y2 y3
    dy2/dt =  0.04 y1 - 1e4 y2 y3 - 3e7 y2^2
    dy3/dt =  3e7 y2^2
from y = (1, 0, 0), to t = 1e5 (--quick: 1e3). An explicit method's step size is bounded by
stability here for the whole solve; Kvaerno5 (an L-stable ESDIRK) lets the PID controller
grow the step as the fast transient dies out. The total y1 + y2 + y3 = 1 is conserved by
the equations, and the script reports how well the solution keeps it, and, when scipy is
installed, the difference from scipy's Radau at tight tolerances.

    python examples/stiff_chemistry.py [--quick] [--out stiff_chemistry.png]
"""

import argparse

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import odesolve as ode  # noqa: E402

jax.config.update("jax_enable_x64", True)


def robertson(t, y, args):
    """Robertson's reactions; y = concentrations (3,)."""
    y1, y2, y3 = y
    fast = 1e4 * y2 * y3
    fastest = 3e7 * y2**2
    return jnp.stack([-0.04 * y1 + fast, 0.04 * y1 - fast - fastest, fastest])


@jax.jit
def solve(ts):
    """Concentrations at ts (log-spaced), shape (len(ts), 3), and the solver's statistics."""
    sol = ode.diffeqsolve(
        ode.ODETerm(robertson),
        ode.Kvaerno5(),
        t0=0.0,
        t1=ts[-1],
        dt0=1e-6,
        y0=jnp.array([1.0, 0.0, 0.0]),
        saveat=ode.SaveAt(ts=ts),
        stepsize_controller=ode.PIDController(rtol=1e-8, atol=1e-12),
        max_steps=4096,
    )
    return sol.ys, sol.stats


def scipy_reference(ts):
    """Radau at rtol 1e-11 on the same save times, or None without scipy."""
    try:
        from scipy.integrate import solve_ivp
    except ImportError:
        return None
    fn = lambda t, y: np.asarray(robertson(t, jnp.asarray(y), None))
    jac = jax.jit(jax.jacfwd(lambda y: robertson(0.0, y, None)))
    sol = solve_ivp(
        fn,
        (0.0, float(ts[-1])),
        [1.0, 0.0, 0.0],
        method="Radau",
        t_eval=np.asarray(ts),
        rtol=1e-11,
        atol=1e-14,
        jac=lambda t, y: np.asarray(jac(jnp.asarray(y))),
    )
    return sol.y.T


def plot(ts, ys, out: str) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.semilogx(ts, ys[:, 0], label="y1")
    ax.semilogx(ts, 1e4 * ys[:, 1], label="1e4 * y2")
    ax.semilogx(ts, ys[:, 2], label="y3")
    ax.set_xlabel("t")
    ax.set_ylabel("concentration")
    ax.set_title("Robertson kinetics, Kvaerno5 + PID (rtol 1e-8)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="solve to t = 1e3 (for CI)")
    parser.add_argument("--out", default="stiff_chemistry.png")
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    """Run the example; returns step counts, conservation error and the scipy difference."""
    args = parse_args(argv)
    ts = jnp.logspace(-5, 3 if args.quick else 5, 200)
    ys, stats = solve(ts)
    conservation = float(jnp.max(jnp.abs(ys.sum(axis=1) - 1.0)))
    reference = scipy_reference(ts)
    difference = None if reference is None else float(np.max(np.abs(np.asarray(ys) - reference)))
    versus_scipy = "scipy not installed" if difference is None else f"{difference:.1e}"
    print(
        f"t1 = {float(ts[-1]):.0e}: {int(stats['num_steps'])} steps "
        f"({int(stats['num_rejected_steps'])} rejected); max |y1 + y2 + y3 - 1| = "
        f"{conservation:.1e}; max |odesolve - scipy Radau| = {versus_scipy}"
    )
    plot(np.asarray(ts), np.asarray(ys), args.out)
    print(f"wrote {args.out}")
    return {
        "num_steps": int(stats["num_steps"]),
        "conservation_error": conservation,
        "scipy_difference": difference,
        "final_state": [float(v) for v in ys[-1]],
        "out": args.out,
    }


if __name__ == "__main__":
    main()
