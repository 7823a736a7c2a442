"""Reversible solvers: memory and time of a gradient against the number of steps, and how
well the reverse sweep rebuilds the states.

    python benchmarks/reversible.py [--quick] [--out benchmarks]

W4's problem (Lotka-Volterra, (a, b, c, d) = (1.5, 1, 3, 1), y0 = (1, 1), [0, 10], constant
steps, gradient of sum(y(10)**2) with respect to the parameters, float64), n = 1e3, 1e4,
1e5 steps, for each adjoint: XLA temp memory of the compiled gradient, its median run
time, and its error against a forward-sensitivity reference. Diffrax's default adjoint is
measured in the same process when installed. The same for a state of 4,096 floats (a
damped nonlinear chain), where stored states cost most. Then the reconstruction error: n steps of
`Reversible(Tsit5(), coupling)` forwards and n undone, the relative error of the rebuilt
initial state, for several couplings. Writes reversible.json and reversible_memory.png.
"""

import argparse
import importlib
import importlib.util
import json
import pathlib
import statistics
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402

import odesolve as ode  # noqa: E402
from odesolve._solver._base import RetreatInput  # noqa: E402
from odesolve.bench import _reference as reference  # noqa: E402

ARGS = jnp.array([1.5, 1.0, 3.0, 1.0])
Y0 = jnp.array([1.0, 1.0])


def field(t, y, args):
    a, b, c, d = args
    return jnp.stack([a * y[0] - b * y[0] * y[1], -c * y[1] + d * y[0] * y[1]])


def _adjoints(lib):
    if lib is ode:
        return {
            # coupling=1: the default 0.999 multiplies rounding errors by 0.999^-n in the
            # reverse sweep, too much for 1e4 steps (see the reconstruction table).
            "odesolve (reversible, coupling=1)": (
                ode.Reversible(ode.Tsit5(), coupling=1.0),
                ode.ReversibleAdjoint(),
            ),
            "odesolve (default, 4 MiB)": (ode.Tsit5(), ode.RecursiveCheckpointAdjoint()),
            "odesolve (16 KiB budget)": (
                ode.Tsit5(),
                ode.RecursiveCheckpointAdjoint(memory_budget=16 * 2**10),
            ),
            "odesolve (tape)": (ode.Tsit5(), ode.RecursiveCheckpointAdjoint(schedule="tape")),
        }
    return {"diffrax (default)": (lib.Tsit5(), lib.RecursiveCheckpointAdjoint())}


WIDE = 4096


def wide_field(t, y, args):
    """A damped chain: each entry pulled towards its neighbours, and a nonlinearity."""
    neighbours = jnp.roll(y, 1) + jnp.roll(y, -1) - 2 * y
    return args[0] * neighbours - args[1] * jnp.sin(y)


def _problem(wide: bool):
    if wide:
        y0 = jnp.cos(jnp.linspace(0.0, 6.0, WIDE))
        return wide_field, y0, jnp.array([0.2, 0.5])
    return field, Y0, ARGS


def _gradient(lib, solver, adjoint, n, wide=False):
    vf, y0, _ = _problem(wide)

    def loss(args):
        sol = lib.diffeqsolve(
            lib.ODETerm(vf), solver, 0.0, 10.0, 10.0 / n, y0, args,
            adjoint=adjoint, max_steps=n,
        )  # fmt: skip
        return jnp.sum(sol.ys**2)

    return jax.jit(jax.grad(loss))


def _time(fn, args, repeats):
    fn(args).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(args).block_until_ready()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def memory_and_time(sizes, repeats, wide=False):
    """Rows of (n, adjoint, temp bytes, ms, error); `wide`: the 4,096-float chain, its
    memory at every size but its time and error (against the checkpointed gradient: no
    scipy reference at that size) only at the smallest, as a gradient of 1e4 steps of
    it takes a minute."""
    libs = [ode]
    if importlib.util.find_spec("diffrax"):  # where installed (`pip install -e ".[bench]"`)
        libs.append(importlib.import_module("diffrax"))
    vf, y0, args = _problem(wide)
    rows = []
    for n in sizes:
        timed = not wide or n == sizes[0]
        if wide and timed:
            exact = _gradient(ode, ode.Tsit5(), ode.RecursiveCheckpointAdjoint(), n, True)(args)
        elif not wide:
            loss = lambda ys: jnp.sum(ys**2)
            exact = reference.sensitivity_gradient(vf, y0, 0.0, (10.0,), args, loss)
        for lib in libs:
            for name, (solver, adjoint) in _adjoints(lib).items():
                if wide and name == "odesolve (tape)":
                    continue  # 7 stages x 4,096 floats a step: gigabytes
                compiled = _gradient(lib, solver, adjoint, n, wide).lower(args).compile()
                temp = compiled.memory_analysis().temp_size_in_bytes
                seconds, error = float("nan"), float("nan")
                if timed:
                    seconds = _time(compiled, args, repeats)
                    error = float(reference.max_rel_error(compiled(args), exact))
                row = dict(n=n, adjoint=name, temp_bytes=temp, ms=1e3 * seconds, error=error)
                rows.append(row)
                print(f"{'wide ' if wide else ''}n={n:>6} {name:<34} {temp / 2**10:>10.1f} KiB"
                      f" {1e3 * seconds:>9.2f} ms  err {error:.1e}")  # fmt: skip
    return rows


def reconstruction(sizes, couplings):
    """n constant steps on [0, 10] forwards, then undone: the rebuilt y0's relative error."""
    rows = []
    for coupling in couplings:
        solver = ode.Reversible(ode.Tsit5(), coupling=coupling)
        for n in sizes:
            ts = jnp.linspace(0.0, 10.0, n + 1)

            y, z = _there_and_back(solver, ts)
            error = float(jnp.max(jnp.abs(y - Y0)) / jnp.max(jnp.abs(Y0)))
            rows.append(dict(coupling=coupling, n=n, error=error))
            print(f"coupling={coupling:<6} n={n:>6} reconstruction error {error:.2e}")
    return rows


@jax.jit
def _there_and_back(solver, ts):
    """The state rebuilt by undoing len(ts) - 1 steps taken from (Y0, Y0)."""

    term = ode.ODETerm(field)

    def forward(carry, t):  # Diffrax's low-level step
        y, _, _, z, _ = solver.step(term, t[0], t[1], carry[0], ARGS, carry[1], False)
        return (y, z), None

    def backward(carry, t):
        y1, z1 = carry
        undo = RetreatInput(vf=field, t0=t[0], h=t[1] - t[0], y1=y1, state1=z1, args=ARGS)
        y, z, _ = solver.retreat(undo)
        return (y, z), None

    pairs = jnp.stack([ts[:-1], ts[1:]], axis=1)
    end, _ = jax.lax.scan(forward, (Y0, Y0), pairs)
    return jax.lax.scan(backward, end, pairs[::-1])[0]


def plot(small, wide, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    titles = ("W4: Lotka-Volterra, 2 floats", f"a chain of {WIDE} floats")
    names = list(dict.fromkeys(r["adjoint"] for r in small + wide))
    colour = {name: f"C{i}" for i, name in enumerate(names)}  # one per adjoint, both panels
    for ax, rows, title in zip(axes, (small, wide), titles):
        for name in dict.fromkeys(r["adjoint"] for r in rows):
            mine = [r for r in rows if r["adjoint"] == name]
            ns, temps = [r["n"] for r in mine], [max(r["temp_bytes"], 1) for r in mine]
            ax.loglog(ns, temps, "o-", label=name, color=colour[name])
        ax.set_xlabel("steps n")
        ax.set_ylabel("XLA temp memory of the gradient (bytes)")
        ax.set_title(title)
        ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--plot", metavar="JSON", help="only draw the figure of a saved run")
    parser.add_argument("--quick", action="store_true", help="n = 1e3, 1e4 only, 3 repeats")
    parser.add_argument("--out", default="benchmarks")
    opts = parser.parse_args()
    if opts.plot:
        saved = json.loads(pathlib.Path(opts.plot).read_text())
        plot(
            saved["memory_and_time"],
            saved["wide"],
            pathlib.Path(opts.out) / "reversible_memory.png",
        )
        return
    sizes = (1000, 10000) if opts.quick else (1000, 10000, 100000)
    out = pathlib.Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    repeats = 3 if opts.quick else 7
    memory = memory_and_time(sizes, repeats)
    wide = memory_and_time(sizes, 3, wide=True)
    rebuilt = reconstruction(sizes, (1.0, 0.999, 0.99, 0.9))
    device = jax.devices()[0].device_kind
    result = dict(device=device, memory_and_time=memory, wide=wide, reconstruction=rebuilt)
    (out / "reversible.json").write_text(json.dumps(result, indent=1))
    plot(memory, wide, out / "reversible_memory.png")


if __name__ == "__main__":
    main()
