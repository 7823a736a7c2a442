"""What a compiled solve launches per step, read from its HLO text: the kernel count the
bench reports beside Diffrax's, and no host callback inside the loop unless a progress
meter asks for one (on a GPU a callback is a round trip to Python every step)."""

import json
import os
import subprocess
import sys

import diffrax
import jax
import jax.numpy as jnp

import odesolve as ode
from odesolve.bench import _kernels, _report

# A step loop around a 3-stage loop of known trip count and a search loop of unknown trip
# count, inside a save loop; one conditional with a host callback in a branch.
HLO = """\
HloModule example

%stage_body (p: (s32[], f32[2])) -> (s32[], f32[2]) {
  %p = (s32[], f32[2]{0}) parameter(0)
  %fusion.1 = f32[2]{0} fusion(%p), kind=kLoop, calls=%fused
  ROOT %tuple.1 = (s32[], f32[2]{0}) tuple(%p, %fusion.1)
}

%stage_cond (p: (s32[], f32[2])) -> pred[] {
  %p = (s32[], f32[2]{0}) parameter(0)
  ROOT %compare.1 = pred[] compare(%p, %p), direction=LT
}

%search_body (p: s32[]) -> s32[] {
  %p = s32[] parameter(0)
  ROOT %add.1 = s32[] add(%p, %p)
}

%search_cond (p: s32[]) -> pred[] {
  %p = s32[] parameter(0)
  ROOT %fusion.2 = pred[] fusion(%p), kind=kLoop, calls=%fused
}

%quiet (p: ()) -> () {
  ROOT %p = () parameter(0)
}

%loud (p: s32[]) -> () {
  %p = s32[] parameter(0)
  ROOT %cb = () custom-call(%p), custom_call_target="xla_ffi_python_gpu_callback"
}

%step_body (p: (s32[], f32[2])) -> (s32[], f32[2]) {
  %p = (s32[], f32[2]{0}) parameter(0)
  %gte = f32[2]{0} get-tuple-element(%p), index=1
  %dot.1 = f32[2]{0} custom-call(%gte), custom_call_target="__cublas$gemm"
  %stages = (s32[], f32[2]{0}) while(%p), condition=%stage_cond, body=%stage_body, backend_config={"known_trip_count":{"n":"3"}}
  %search = s32[] while(%gte), condition=%search_cond, body=%search_body
  %maybe = () conditional(%gte, %gte, %gte), branch_computations={%quiet, %loud}
  %copy.1 = f32[2]{0} copy(%gte)
  ROOT %tuple.2 = (s32[], f32[2]{0}) tuple(%p, %copy.1)
}

%step_cond (p: (s32[], f32[2])) -> pred[] {
  %p = (s32[], f32[2]{0}) parameter(0)
  ROOT %compare.2 = pred[] compare(%p, %p), direction=LT
}

%save_body (p: (s32[], f32[2])) -> (s32[], f32[2]) {
  %p = (s32[], f32[2]{0}) parameter(0)
  %steps = (s32[], f32[2]{0}) while(%p), condition=%step_cond, body=%step_body
  ROOT %fusion.3 = (s32[], f32[2]{0}) fusion(%steps), kind=kLoop, calls=%fused
}

ENTRY %main (a: f32[2]) -> (s32[], f32[2]) {
  %a = f32[2]{0} parameter(0)
  %constant.1 = s32[] constant(0)
  %tuple.3 = (s32[], f32[2]{0}) tuple(%constant.1, %a)
  ROOT %saves = (s32[], f32[2]{0}) while(%tuple.3), condition=%step_cond, body=%save_body
}
"""


def test_kernels_per_iteration_of_each_loop():
    """The step loop: the gemm, 3 x (stage fusion + its condition), the search loop's
    condition once, the conditional (its predicate and the larger branch), the copy, and
    its own condition: 1 + 6 + 1 + 2 + 1 + 1 = 12 kernels, 3 predicates (the search
    loop's, the conditional's, its own). The save loop around it: its fusion, the step
    loop's condition and its own: 3 kernels, 2 predicates."""
    Cost = _kernels.Cost
    found = {loop.name: loop for loop in _kernels.loops(HLO)}
    assert set(found) == {"saves", "steps", "search"}
    steps, saves, search = found["steps"], found["saves"], found["search"]
    assert (steps.body, steps.condition) == (Cost(11, 1, 2), Cost(1, 0, 1))
    assert saves.per_iteration == Cost(3, 0, 2) and search.per_iteration == Cost(2, 0, 1)
    assert [found[n].depth for n in ("saves", "steps", "search")] == [0, 1, 2]
    # The search loop's kernels are launched at each of its iterations, unknown here: the
    # step loop's count leaves them out, and says so.
    assert [found[n].inner for n in ("saves", "steps", "search")] == [2, 1, 0]
    assert _kernels.step_loop(list(found.values())) == steps


def test_a_count_that_leaves_out_loops_inside_the_step_is_marked_as_a_lower_bound():
    """Diffrax runs its stages in a loop of unknown trip count inside the step loop under
    `vmap`; the table marks its count (and any other such) with a `+` and says why."""
    row = dict(case="W10", library="diffrax", kernels_per_step=33, inner_loops_per_step=1)
    ours = dict(row, library="odesolve", kernels_per_step=27, inner_loops_per_step=0)
    none = dict(row, library="scan", kernels_per_step=None, inner_loops_per_step=None)
    cells = [_report._inner_mark(r) for r in (row, ours, none)]
    assert cells == ["+", "", ""]
    assert _report.INNER_NOTE.startswith("+ at least")


def _decay_solve(lib, meter=None):
    """A vmapped float32 solve, with `meter` as its progress meter when given."""
    extra = {} if meter is None else dict(progress_meter=meter)

    def one(y0):
        term = lib.ODETerm(lambda t, y, args: -args * y)
        controller = lib.PIDController(rtol=1e-5, atol=1e-5)
        solver, ts = lib.Tsit5(), lib.SaveAt(ts=jnp.linspace(0.0, 1.0, 5, dtype=jnp.float32))
        args = jnp.float32(2.0)
        options = dict(saveat=ts, stepsize_controller=controller, **extra)
        sol = lib.diffeqsolve(term, solver, 0.0, 1.0, 0.1, y0, args, **options)
        return sol.ys

    return jax.vmap(one)


def test_no_host_callback_in_the_loop_unless_a_progress_meter():
    """`throw=True` raises through a callback after the loop, never inside it; a progress
    meter's callback is inside it (so the check can see one). Diffrax's step loop is
    counted the same way."""
    y0s = jnp.ones((4, 2), jnp.float32)
    plain = _kernels.count(_decay_solve(ode), y0s)
    assert plain is not None and plain["callbacks"] == 0 and plain["per_step"] > 0
    text = jax.jit(_decay_solve(ode)).lower(y0s).compile().as_text()
    assert text is not None and "callback" in text  # the failure check, outside the loop
    metered = _kernels.count(_decay_solve(ode, ode.TextProgressMeter()), y0s)
    assert metered is not None and metered["callbacks"] > 0
    theirs = _kernels.count(_decay_solve(diffrax), y0s)
    assert theirs is not None and theirs["callbacks"] == 0 and theirs["per_step"] > 0


# Counted in a child process on XLA:CPU's default (fusion) emitters, which a user's
# program gets: the suite compiles with the classic ones (conftest.py), whose program for
# the solve with save times evaluates one predicate a step.
_PREDICATES_PER_STEP = """
import json, sys
import jax, jax.numpy as jnp
import odesolve as ode
from odesolve.bench import _kernels

def solve(saveat):
    def one(y0):
        term = ode.ODETerm(lambda t, y, args: -args * y)
        controller = ode.PIDController(rtol=1e-5, atol=1e-5)
        options = dict(saveat=saveat, stepsize_controller=controller)
        return ode.diffeqsolve(term, ode.Tsit5(), 0.0, 1.0, 0.1, y0, 2.0, **options).ys
    return jax.vmap(one)

y0s = jnp.ones((4, 2), jnp.float32)
ts = ode.SaveAt(ts=jnp.linspace(0.0, 1.0, 5, dtype=jnp.float32))
counts = [_kernels.count(solve(saveat), y0s) for saveat in (ode.SaveAt(t1=True), ts)]
json.dump([c and c["predicates_per_step"] for c in counts], sys.stdout)
"""


def test_a_batched_solve_without_output_between_steps_has_one_predicate_a_step():
    """With no save times, every lockstep round steps some sample: the loop's condition
    is the only predicate a step evaluates (a GPU reads each back to the host). A solve
    with save times keeps the branch that skips a step in a round that only emits."""
    flags = os.environ.get("XLA_FLAGS", "").replace("--xla_cpu_use_fusion_emitters=false", "")
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    command = [sys.executable, "-c", _PREDICATES_PER_STEP]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    final, saved = json.loads(done.stdout)
    assert final == 1
    assert saved is not None and saved > 1


def _step_loop_carry(fn, *inputs) -> str:
    """The types of the compiled step loop's carry, as the HLO text writes them."""
    text = jax.jit(fn).lower(*inputs).compile().as_text()
    step = _kernels.step_loop(_kernels.loops(text))
    assert step is not None
    (loop,) = [i for c in _kernels.parse(text).values() for i in c if i.name == step.name]
    return loop.text.split(" while(")[0]


def test_an_unbatched_loop_carries_a_steps_dense_vectors_as_one_buffer():
    """XLA:CPU gives each carry buffer a kernel of its own before the loop, and hands half
    of the kernels ready at once to a worker thread past 8, which may then run the loop.
    So an unbatched solve's carry holds the state, its slope and the last step's start
    apart, and the step's dense vectors as one (vectors, n) buffer, however many the
    solver has: 7 for Tsit5, 6 for Dopri5, 10 for Dopri8."""
    rates = jnp.array([1.5, 1.0, 3.0, 1.0])

    def field(t, y, a):
        return jnp.stack([a[0] * y[0] - a[1] * y[0] * y[1], -a[2] * y[1] + a[3] * y[0] * y[1]])

    for solver, vectors in ((ode.Tsit5(), 7), (ode.Dopri5(), 6), (ode.Dopri8(), 10)):

        def solve(a, solver=solver):
            ts = ode.SaveAt(ts=jnp.linspace(0.0, 5.0, 20))
            controller = ode.PIDController(rtol=1e-8, atol=1e-8)
            y0 = jnp.array([1.0, 1.0])
            term = ode.ODETerm(field)
            return ode.diffeqsolve(
                term, solver, 0.0, 5.0, 0.01, y0, a, saveat=ts, stepsize_controller=controller
            ).ys

        carry = _step_loop_carry(solve, rates)
        assert carry.count("f64[2]{0}") == 3, (solver, carry)
        assert carry.count(f"f64[{vectors},2]") == 1, (solver, carry)
