"""Side-by-side timings of odesolve and Diffrax on workloads W1, W2 and W4 of
shared/BENCHMARKS.md, in one process, with steps, evaluations and accuracy.

    python benchmarks/compare.py [--only W1,W2,W4] [--repeats 15] [--json out.json]

Ratios are odesolve / diffrax (lower is better). Times are medians of interleaved calls
after a warm-up call; compile time is the first call minus the median.
"""

import argparse
import json
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import diffrax  # noqa: E402
import scipy.integrate  # noqa: E402

import odesolve  # noqa: E402

LV_ARGS = jnp.array([1.5, 1.0, 3.0, 1.0])
Y0 = jnp.array([1.0, 1.0])


def lotka_volterra(t, y, args):
    a, b, c, d = args
    x, z = y[0], y[1]
    return jnp.stack([a * x - b * x * z, -c * z + d * x * z])


def timed(fns, args, repeats):
    """Interleaved medians (s) and first-call times (s) of each function."""
    first = []
    for f in fns:
        start = time.perf_counter()
        jax.block_until_ready(f(*args))
        first.append(time.perf_counter() - start)
    samples = [[] for _ in fns]
    for _ in range(repeats):
        for i, f in enumerate(fns):
            start = time.perf_counter()
            jax.block_until_ready(f(*args))
            samples[i].append(time.perf_counter() - start)
    medians = [float(np.median(s)) for s in samples]
    return medians, [max(f - m, 0.0) for f, m in zip(first, medians)]


def w1_solve(lib, ts):
    @jax.jit
    def solve(args):
        return lib.diffeqsolve(
            lib.ODETerm(lotka_volterra),
            lib.Tsit5(),
            0.0,
            50.0,
            0.01,
            Y0,
            args,
            saveat=lib.SaveAt(ts=ts),
            stepsize_controller=lib.PIDController(rtol=1e-8, atol=1e-8),
            max_steps=4096,
        )

    return solve


def w1(repeats):
    ts = jnp.linspace(0.0, 50.0, 200)
    ref = scipy.integrate.solve_ivp(
        lambda t, y: np.asarray(lotka_volterra(t, jnp.asarray(y), LV_ARGS)),
        (0, 50),
        np.asarray(Y0),
        method="DOP853",
        rtol=1e-13,
        atol=1e-13,
        t_eval=np.asarray(ts),
    ).y.T
    solves = {"odesolve": w1_solve(odesolve, ts), "diffrax": w1_solve(diffrax, ts)}
    fns = [lambda a, s=s: s(a).ys for s in solves.values()]
    run, compile_ = timed(fns, (LV_ARGS,), repeats)
    rows = []
    for (name, solve), r, c in zip(solves.items(), run, compile_):
        sol = solve(LV_ARGS)
        rows.append(
            dict(
                workload="W1",
                library=name,
                run_ms=1e3 * r,
                compile_s=c,
                steps=int(sol.stats["num_steps"]),
                error=float(np.max(np.abs(sol.ys - ref))),
            )
        )
    return rows


def w2(repeats):
    ts = jnp.linspace(0.0, 50.0, 200)

    def grad_of(lib, adjoint):
        solve = lambda args: lib.diffeqsolve(
            lib.ODETerm(lotka_volterra),
            lib.Tsit5(),
            0.0,
            50.0,
            0.01,
            Y0,
            args,
            saveat=lib.SaveAt(ts=ts),
            adjoint=adjoint,
            stepsize_controller=lib.PIDController(rtol=1e-8, atol=1e-8),
            max_steps=4096,
        )
        return jax.jit(jax.grad(lambda args: jnp.sum(solve(args).ys ** 2)))

    fns = {
        "odesolve": grad_of(odesolve, odesolve.RecursiveCheckpointAdjoint()),
        "diffrax": grad_of(diffrax, diffrax.RecursiveCheckpointAdjoint()),
    }
    run, compile_ = timed(list(fns.values()), (LV_ARGS,), repeats)
    reference = fns["diffrax"](LV_ARGS)
    rows = []
    for (name, f), r, c in zip(fns.items(), run, compile_):
        g = f(LV_ARGS)
        rows.append(
            dict(
                workload="W2",
                library=name,
                run_ms=1e3 * r,
                compile_s=c,
                grad_rel_diff_vs_diffrax=float(
                    jnp.max(jnp.abs(g - reference) / jnp.abs(reference))
                ),
            )
        )
    return rows


def rk4_scan_grad(n):
    """The limit: a hand-written RK4 `lax.scan` storing every step for reverse mode."""
    h = 10.0 / n

    def loss(args):
        def step(y, i):
            t = i * h
            k1 = lotka_volterra(t, y, args)
            k2 = lotka_volterra(t + h / 2, y + h / 2 * k1, args)
            k3 = lotka_volterra(t + h / 2, y + h / 2 * k2, args)
            k4 = lotka_volterra(t + h, y + h * k3, args)
            return y + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4), None

        y, _ = jax.lax.scan(step, Y0, jnp.arange(n))
        return jnp.sum(y**2)

    return jax.jit(jax.grad(loss))


def w4_grad(lib, n, adjoint):
    def loss(args):
        sol = lib.diffeqsolve(
            lib.ODETerm(lotka_volterra),
            lib.Tsit5(),
            0.0,
            10.0,
            10.0 / n,
            Y0,
            args,
            adjoint=adjoint,
            max_steps=n,
        )
        return jnp.sum(sol.ys**2)

    return jax.jit(jax.grad(loss))


def temp_bytes(f, *args):
    analysis = f.lower(*args).compile().memory_analysis()
    return None if analysis is None else int(analysis.temp_size_in_bytes)


def w4(repeats, sizes=(1_000, 10_000, 100_000)):
    rows = []
    for n in sizes:
        # Diffrax's default keeps floor(-1.5 + sqrt(2 n + 0.25)) + 1 states; give
        # odesolve the same number for the like-for-like memory comparison.
        slots = int(np.floor(-1.5 + np.sqrt(2 * n + 0.25))) + 1
        fns = {
            "odesolve (same checkpoints)": w4_grad(
                odesolve, n, odesolve.RecursiveCheckpointAdjoint(checkpoints=slots)
            ),
            "odesolve (tape)": w4_grad(
                odesolve, n, odesolve.RecursiveCheckpointAdjoint(memory_budget=2**30)
            ),
            "diffrax": w4_grad(diffrax, n, diffrax.RecursiveCheckpointAdjoint()),
            "lax.scan RK4": rk4_scan_grad(n),
        }
        reps = repeats if n <= 10_000 else max(3, repeats // 4)
        run, compile_ = timed(list(fns.values()), (LV_ARGS,), reps)
        for (name, f), r, c in zip(fns.items(), run, compile_):
            rows.append(
                dict(
                    workload=f"W4 n={n}",
                    library=name,
                    run_ms=1e3 * r,
                    compile_s=c,
                    temp_bytes=temp_bytes(f, LV_ARGS),
                )
            )
    return rows


def table(rows):
    base = {r["workload"]: r["run_ms"] for r in rows if r["library"] == "diffrax"}
    print(f"{'workload':12} {'library':28} {'run ms':>10} {'ratio':>7} {'compile s':>9}  extra")
    for r in rows:
        ratio = r["run_ms"] / base[r["workload"]]
        extra = {
            k: v for k, v in r.items() if k not in ("workload", "library", "run_ms", "compile_s")
        }
        print(
            f"{r['workload']:12} {r['library']:28} {r['run_ms']:10.3f} {ratio:7.3f} "
            f"{r['compile_s']:9.2f}  {extra}"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", default="W1,W2,W4")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", default=None)
    options = parser.parse_args()
    chosen = set(options.only.split(","))
    rows = []
    for name, run in (("W1", w1), ("W2", w2), ("W4", w4)):
        if name in chosen:
            rows += run(options.repeats)
    table(rows)
    if options.json:
        meta = dict(
            machine=platform.platform(),
            device=str(jax.devices()[0]),
            jax=jax.__version__,
            diffrax=diffrax.__version__,
        )
        with open(options.json, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
