"""Operations launched per step, counted from a profile of the run, against Diffrax.

The bench's kernels-per-step column is read from the compiled HLO text, where a loop of
unknown trip count inside the step loop (Diffrax's loop over a step's stages under
`vmap`, a loop over save times) counts only its condition: such counts are lower bounds
(marked `+`). Here every operation XLA:CPU executes is counted from a `jax.profiler`
trace of a few calls (fusions, library calls and copies; not the loops and conditionals
that hold them), divided by the number of steps of the slowest sample: what a GPU would
launch, as far as XLA:CPU fuses the same way.

    python benchmarks/launches.py        # W1, W3's gradient, W6's forward solve, W10
"""

import collections
import glob
import gzip
import json
import tempfile

import diffrax
import jax

import odesolve
from odesolve.bench import _workloads as workloads

CALLS = 3
# Trace events that are not operations: the host side of a call, and the control flow
# that holds operations (its own predicate is counted by the bench, not here).
HOST = ("$", "Thunk", "Pjit", "Common", "end:", "ParseArguments")
CONTROL = ("while", "cond", "conditional", "call")


def launches_per_call(fn, *inputs) -> float:
    """Operations executed per call of the jitted `fn` on `inputs`."""
    jax.block_until_ready(fn(*inputs))
    with tempfile.TemporaryDirectory() as folder:
        jax.profiler.start_trace(folder)
        for _ in range(CALLS):
            out = fn(*inputs)
        jax.block_until_ready(out)
        jax.profiler.stop_trace()
        (path,) = glob.glob(f"{folder}/**/*.trace.json.gz", recursive=True)
        events = json.load(gzip.open(path))["traceEvents"]
    names = collections.Counter(
        e["name"]
        for e in events
        if e.get("ph") == "X"
        and not e["name"].startswith(HOST)
        and e["name"].split(".")[0] not in CONTROL
    )
    return sum(names.values()) / CALLS


def cases(lib):
    """(name, jitted function, inputs, steps of the slowest sample from its output)."""
    from odesolve.bench import _w10  # after _workloads, which imports it

    ts, y0, args = workloads._lv_problem()
    yield "W1", jax.jit(lambda a: workloads._lv_solve(lib, ts, y0, a)), (args,), lambda o: o[1]
    params, _, y0s, _ = workloads._neural_problem(256)
    solve, value_and_grad = workloads._neural_functions(lib, 256)
    yield "W3 gradient", jax.jit(value_and_grad), (params, y0s), lambda o: o[1].max()
    yield "W6 forward", jax.jit(solve), (params, y0s), lambda o: o[1].max()
    rates, y0s = _w10.ensemble(4096)
    solve = jax.jit(lambda r, y: _w10.ensemble_solve(lib, r, y))
    yield "W10", solve, (rates, y0s), lambda o: o[1].max()


def main() -> None:
    jax.config.update("jax_enable_x64", True)  # W1 is float64; the others are float32
    print(f"{'case':14s} {'library':9s} {'per step':>9s} {'steps':>6s}")
    for lib in (odesolve, diffrax):
        for name, fn, inputs, steps_of in cases(lib):
            steps = int(steps_of(fn(*inputs)))
            per_step = launches_per_call(fn, *inputs) / steps
            print(f"{name:14s} {lib.__name__:9s} {per_step:9.1f} {steps:6d}")


if __name__ == "__main__":
    main()
