"""Registries for the gradient-composition matrix (`test_composition.py`).

Each factor is a registry: adjoints (and the default adjoint's schedules), transformations
in the orders users compose them, the ways parameters reach the field, fields using JAX
control flow, and controllers (with `jump_ts` and events). A new adjoint, schedule,
transformation or field is covered by adding one entry here. Every case is compared with
forward mode through the plain loop (`ForwardMode`: JAX's own JVP of a `while_loop`,
sharing no code with any reverse sweep), one sample at a time, without `vmap`, so a
reference never shares the composition it checks.
"""

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import odesolve as ode

T1 = 1.0
SAVE_TS = jnp.array([0.5, T1])
P = jnp.array([1.2, 0.7, 1.9])  # the shared parameters
Y0S = jnp.array([[1.0, 0.6], [1.4, 0.3], [0.8, 0.9]])  # one initial state per sample
PS = P * jnp.array([[1.0], [1.1], [0.9]])  # per-sample parameters
V = jnp.array([0.3, -0.5, 0.8])  # a tangent of the parameters


# --------------------------------------------------------------------------- fields


def smooth(t, y, p):
    return jnp.stack([p[0] * y[0] - p[1] * y[0] * y[1], -p[2] * y[1] + p[1] * y[0] * y[1]])


def with_cond(t, y, p):
    return lax.cond(y[0] > 1.0, lambda: smooth(t, y, p), lambda: 0.8 * smooth(t, y, p))


def with_switch(t, y, p):
    index = jnp.clip(jnp.floor(2 * y[1]).astype(jnp.int32), 0, 2)
    branches = [lambda s=s: s * smooth(t, y, p) for s in (1.0, 0.9, 1.1)]
    return lax.switch(index, branches)


def with_where(t, y, p):
    return jnp.where(y[1] > 0.5, smooth(t, y, p), 1.2 * smooth(t, y, p))


@jax.custom_jvp
def _damped(x, p):
    return x * jnp.tanh(p)


@_damped.defjvp
def _damped_jvp(primals, tangents):
    x, p = primals
    dx, dp = tangents
    # JAX passes zeros for an input that is not differentiated (this rule is written
    # for any mix of the two).
    return _damped(x, p), dx * jnp.tanh(p) + x * dp / jnp.cosh(p) ** 2


@jax.custom_jvp
def _scaled(y, p):
    return y * p


def _scaled_jvp(primals, tangents):
    y, p = primals
    dy, dp = tangents
    # Symbolic zeros: a `SymbolicZero` tangent for an input that is not differentiated.
    out = y * p
    t = jnp.zeros_like(out)
    if not isinstance(dy, jax.custom_derivatives.SymbolicZero):
        t = t + dy * p
    if not isinstance(dp, jax.custom_derivatives.SymbolicZero):
        t = t + y * dp
    return out, t


_scaled.defjvp(_scaled_jvp, symbolic_zeros=True)


def with_custom_jvp(t, y, p):
    f = smooth(t, y, p)
    return jnp.stack([_damped(f[0], p[0]), _scaled(f[1], p[2] / 1.9)])


def with_stop_gradient(t, y, p):
    return smooth(t, y, p) - 0.1 * lax.stop_gradient(p[0] * y)


# Fields without a discontinuity.
CONTINUOUS = ("smooth", "custom_jvp", "stop_gradient")

FIELDS: dict[str, Callable] = {
    "smooth": smooth,
    "cond": with_cond,
    "switch": with_switch,
    "where": with_where,
    "custom_jvp": with_custom_jvp,
    "stop_gradient": with_stop_gradient,
}


# --------------------------------------------------------------------------- parameters


class FieldModule(eqx.Module):
    """The field as an `eqx.Module` whose parameters are a field of it."""

    p: jax.Array
    fn: Callable = eqx.field(static=True)

    def __call__(self, t, y, args):
        return self.fn(t, y, self.p)


def as_args(fn, p):
    return ode.ODETerm(fn), p


def as_closure(fn, p):
    # `p` is a tracer under every transformation: the field closes over it.
    return ode.ODETerm(lambda t, y, args: fn(t, y, p)), None


def as_module(fn, p):
    return ode.ODETerm(FieldModule(p, fn)), None


PARAMS: dict[str, Callable] = {"args": as_args, "closure": as_closure, "module": as_module}


# --------------------------------------------------------------------------- controllers


@dataclass(frozen=True)
class Controller:
    dt0: float | None
    make: Callable
    event: bool = False
    fixed: bool = True  # a number of steps known when traced


CONTROLLERS: dict[str, Controller] = {
    "constant": Controller(0.1, lambda: ode.ConstantStepSize()),
    "pid": Controller(None, lambda: ode.PIDController(rtol=1e-8, atol=1e-8), fixed=False),
    "pid_jump": Controller(
        None,
        lambda: ode.PIDController(rtol=1e-8, atol=1e-8, jump_ts=jnp.array([0.45])),
        fixed=False,
    ),
    # Stops near t = 0.8, at a time that depends on the state: the solve's length and its
    # output (the state at the event) depend on the event time.
    "event": Controller(0.05, lambda: ode.ConstantStepSize(), event=True, fixed=False),
}


def _event(t, y, args, **kwargs):
    return t - 0.7 - 0.1 * y[0]


# --------------------------------------------------------------------------- adjoints


@dataclass(frozen=True)
class Adjoint:
    make: Callable
    reverse: bool = True
    forward: bool = False
    needs_fixed: bool = False  # offline schedules: a known number of steps, no saving
    rtol: float = 1e-10
    events: bool = True
    # A continuous adjoint solves the adjoint ODE backwards: only for continuous fields.
    continuous: bool = False
    # The solver it differentiates (a key of SOLVERS); the reference uses the same one.
    # Bosh3: three stages compile in about two thirds of Tsit5's time, and the sweeps
    # are the same whatever the tableau.
    solver: str = "bosh3"


def _checkpointed(**kw):
    return lambda: ode.RecursiveCheckpointAdjoint(**kw)


ADJOINTS: dict[str, Adjoint] = {
    "default": Adjoint(_checkpointed()),
    "checkpoints=3": Adjoint(_checkpointed(checkpoints=3)),
    "tape": Adjoint(_checkpointed(schedule="tape")),
    "segments": Adjoint(_checkpointed(schedule="segments", checkpoints=3)),
    "online": Adjoint(_checkpointed(schedule="online", checkpoints=3)),
    "revolve": Adjoint(_checkpointed(schedule="revolve", checkpoints=3), needs_fixed=True),
    "nested": Adjoint(_checkpointed(schedule="nested", memory_budget=1), needs_fixed=True),
    "direct": Adjoint(lambda: ode.DirectAdjoint(), forward=True),
    "backsolve": Adjoint(
        lambda: ode.BacksolveAdjoint(stepsize_controller=ode.PIDController(rtol=1e-10, atol=1e-10)),
        rtol=1e-5,
        events=False,
        continuous=True,
        # The continuous adjoint matches the discrete gradient to the solver's accuracy.
        solver="tsit5",
    ),
    "forward": Adjoint(lambda: ode.ForwardMode(), reverse=False, forward=True),
    # Exact but for rounding in the rebuilt states, which the solve amplifies.
    "reversible": Adjoint(lambda: ode.ReversibleAdjoint(), rtol=1e-8, solver="reversible"),
}

SOLVERS: dict[str, Callable] = {
    "bosh3": lambda: ode.Bosh3(),
    "tsit5": lambda: ode.Tsit5(),
    "reversible": lambda: ode.Reversible(ode.Bosh3()),
}
# Step bounds: the reversible solver also holds the gap between its two states within the
# tolerance, which takes up to 2.5 times Bosh3's steps on these fields (365 against 152).
MAX_STEPS = {"bosh3": 256, "tsit5": 256, "reversible": 1024}


# --------------------------------------------------------------------------- the problem


@dataclass(frozen=True)
class Problem:
    field: str
    params: str
    controller: str
    offline: bool  # save y(t1) only, as offline schedules need
    solver: str = "bosh3"

    def solve(self, p, y0, adjoint):
        ctrl = CONTROLLERS[self.controller]
        term, args = PARAMS[self.params](FIELDS[self.field], p)
        # Offline schedules save nothing between steps; an event saves where it stops.
        final_only = self.offline or ctrl.event
        saveat = ode.SaveAt(t1=True) if final_only else ode.SaveAt(ts=SAVE_TS)
        sol = ode.diffeqsolve(
            term,
            SOLVERS[self.solver](),
            0.0,
            T1,
            ctrl.dt0,
            y0,
            args,
            saveat=saveat,
            stepsize_controller=ctrl.make(),
            adjoint=adjoint,
            event=ode.Event(_event) if ctrl.event else None,
            max_steps=MAX_STEPS[self.solver],
        )
        return sol.ys

    def outputs(self, adjoint):
        return lambda p, y0: jnp.ravel(self.solve(p, y0, adjoint))

    def loss(self, adjoint):
        return lambda p, y0: jnp.sum(self.outputs(adjoint)(p, y0) ** 2)


# --------------------------------------------------------------------------- transformations


@dataclass(frozen=True)
class Transformation:
    """`run(problem, adjoint)` under the transformation; `reference(problem, forward)` the
    same quantity built one sample at a time in forward mode."""

    run: Callable
    reference: Callable
    reverse: bool = True  # needs reverse mode (else forward mode)


def _per_sample(problem, forward, ps=None):
    grad = jax.jit(jax.jacfwd(problem.loss(forward)))
    ps = [P] * len(Y0S) if ps is None else list(ps)
    return jnp.stack([grad(p, y0) for p, y0 in zip(ps, Y0S)])


def _nested_y0s():
    return jnp.stack([Y0S, Y0S[::-1]])  # (2, 3, 2): two batches of three samples


def _module_grads(problem, adjoint):
    loss = problem.loss(adjoint)
    module_loss = lambda m, y0: loss(m.p, y0)
    grads = eqx.filter_vmap(eqx.filter_grad(module_loss), in_axes=(None, 0))
    return grads(FieldModule(P, smooth), Y0S).p


def _hvp(problem, adjoint):
    grad = jax.grad(problem.loss(adjoint))
    return jax.jit(lambda p, v: jax.jvp(lambda q: grad(q, Y0S[0]), (p,), (v,))[1])(P, V)


TRANSFORMATIONS: dict[str, Transformation] = {
    "grad": Transformation(
        lambda pr, a: jax.grad(pr.loss(a))(P, Y0S[0]),
        lambda pr, f: _per_sample(pr, f)[0],
    ),
    "jit(grad)": Transformation(
        lambda pr, a: jax.jit(jax.grad(pr.loss(a)))(P, Y0S[0]),
        lambda pr, f: _per_sample(pr, f)[0],
    ),
    "vmap(grad) shared": Transformation(
        lambda pr, a: jax.vmap(jax.grad(pr.loss(a)), in_axes=(None, 0))(P, Y0S),
        lambda pr, f: _per_sample(pr, f),
    ),
    "vmap(grad) batched": Transformation(
        lambda pr, a: jax.jit(jax.vmap(jax.grad(pr.loss(a))))(PS, Y0S),
        lambda pr, f: _per_sample(pr, f, PS),
    ),
    "grad(vmap)": Transformation(
        lambda pr, a: jax.grad(lambda p: jnp.sum(jax.vmap(pr.loss(a), (None, 0))(p, Y0S)))(P),
        lambda pr, f: jnp.sum(_per_sample(pr, f), axis=0),
    ),
    "vmap(vmap(grad))": Transformation(
        lambda pr, a: jax.vmap(jax.vmap(jax.grad(pr.loss(a)), (None, 0)), (None, 0))(
            P, _nested_y0s()
        ),
        lambda pr, f: jnp.stack([_per_sample(pr, f), _per_sample(pr, f)[::-1]]),
    ),
    "jacrev": Transformation(
        lambda pr, a: jax.jacrev(pr.outputs(a))(P, Y0S[0]),
        lambda pr, f: jax.jit(jax.jacfwd(pr.outputs(f)))(P, Y0S[0]),
    ),
    "hessian": Transformation(
        lambda pr, a: jax.jit(jax.hessian(pr.loss(a)))(P, Y0S[0]),
        lambda pr, f: jax.jit(jax.jacfwd(jax.jacfwd(pr.loss(f))))(P, Y0S[0]),
    ),
    "jvp(grad)": Transformation(
        _hvp, lambda pr, f: jax.jit(jax.jacfwd(jax.jacfwd(pr.loss(f))))(P, Y0S[0]) @ V
    ),
    "jit(jvp)": Transformation(
        lambda pr, a: jax.jit(lambda p, v: jax.jvp(lambda q: pr.loss(a)(q, Y0S[0]), (p,), (v,))[1])(
            P, V
        ),
        lambda pr, f: jnp.dot(_per_sample(pr, f)[0], V),
        reverse=False,
    ),
    "filter_vmap(filter_grad)": Transformation(_module_grads, lambda pr, f: _per_sample(pr, f)),
}


# --------------------------------------------------------------------------- the cases


@dataclass(frozen=True)
class Case:
    adjoint: str
    transformation: str
    params: str
    field: str
    controller: str

    @property
    def id(self) -> str:
        return "-".join(
            (self.adjoint, self.transformation, self.params, self.field, self.controller)
        ).replace(" ", "_")


FACTORS = (ADJOINTS, TRANSFORMATIONS, PARAMS, FIELDS, CONTROLLERS)


def valid(case: Case) -> bool:
    adjoint = ADJOINTS[case.adjoint]
    transformation = TRANSFORMATIONS[case.transformation]
    controller = CONTROLLERS[case.controller]
    if transformation.reverse and not adjoint.reverse:
        return False
    if not transformation.reverse and not adjoint.forward:
        return False
    if adjoint.needs_fixed and not controller.fixed:
        return False
    if controller.event and not adjoint.events:
        return False
    if adjoint.continuous and case.field not in CONTINUOUS:
        return False
    # The first sample starts exactly on the jump of `with_cond`: a reversible solver
    # cannot undo a step that starts on a discontinuity (the rebuilt state lands on
    # either side), and raises instead (test_reversible.py). `switch` and `where` cover
    # fields with branches.
    if adjoint.solver == "reversible" and case.field == "cond":
        return False
    # The module transformation differentiates a module of its own (the smooth field).
    if case.transformation == "filter_vmap(filter_grad)" and (
        case.params != "module" or case.field != "smooth"
    ):
        return False
    return True


# Values left to the marked runs: each shares its code path with a value the suite keeps
# (`jvp(grad)` is the forward-over-reverse that `hessian` repeats per direction). The
# checkpointing schedules differ from `default` (bare segments unbatched, taped segments
# under `vmap`, for adaptive steps; a tape for fixed ones) only in where states are
# stored and how often steps are recomputed: their custom VJP and
# its batching rules are the same code, and test_adjoints.py and test_schedules.py check
# each schedule's gradients and recomputations.
# The reversible adjoint's batched reverse sweep, undoing and linearising a double step,
# compiles slowly with a branching field under nested `vmap` (over a minute): the suite
# keeps a few cases on the smooth field (`reversible_cases`).
HEAVY = {
    *("tape", "online", "segments", "revolve", "nested", "checkpoints=3", "reversible"),
    *("grad", "hessian"),
}


def all_cases(light: bool = False) -> list[Case]:
    """Every valid case; `light`: without the `HEAVY` values."""
    names = [[n for n in f if not (light and n in HEAVY)] for f in FACTORS]
    return [c for c in (Case(*combo) for combo in itertools.product(*names)) if valid(c)]


def reversible_cases() -> list[Case]:
    """The reversible adjoint under the transformations that batch or nest its reverse
    sweep, on the smooth field with adaptive steps and save times, and a closure with an
    event under `jit(grad)`; every pair runs with `-m matrix`."""
    names = ("vmap(grad) shared", "vmap(grad) batched", "grad(vmap)", "jacrev", "vmap(vmap(grad))")
    cases = [Case("reversible", t, "args", "smooth", "pid") for t in names]
    # And a closure with an event.
    cases.append(Case("reversible", "jit(grad)", "closure", "smooth", "event"))
    return [c for c in cases if valid(c)]


def _combinations(case: Case, strength: int) -> set:
    """The (factor, value) combinations of `strength` factors that `case` holds."""
    values = (case.adjoint, case.transformation, case.params, case.field, case.controller)
    return {
        tuple((i, values[i]) for i in factors)
        for factors in itertools.combinations(range(len(values)), strength)
    }


def covering_cases(
    light: bool = False,
    seed: int = 0,
    strength: int = 2,
    avoid: Callable[[Case], bool] | None = None,
) -> list[Case]:
    """Valid cases covering every combination of `strength` factor values (2: every pair;
    1: every value) that some valid case covers (greedy, as in AETG: each new case the
    best of a random sample); `light`: of the values outside `HEAVY`; `avoid`: cases
    left out (their combinations are then covered by others where some other holds
    them)."""
    cases = [c for c in all_cases(light) if avoid is None or not avoid(c)]
    # Each case's combinations, and the cases holding each combination (in case order),
    # computed once: every pytest worker builds these sets when it collects.
    held = {c: _combinations(c, strength) for c in cases}
    holders: dict[tuple, list[Case]] = {}
    for c in cases:
        for combination in held[c]:
            holders.setdefault(combination, []).append(c)
    uncovered = set(holders)
    rng = random.Random(seed)
    chosen = []
    while uncovered:
        # Start from a case covering some uncovered combination, then take the best of a
        # sample.
        starters = holders[min(uncovered)]
        sample = rng.sample(starters, min(len(starters), 40))
        best = max(sample, key=lambda c: len(held[c] & uncovered))
        chosen.append(best)
        uncovered -= held[best]
    return chosen


def relative_error(actual, expected) -> float:
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    return float(np.max(np.abs(actual - expected)) / max(np.max(np.abs(expected)), 1e-300))


@dataclass
class References:
    """The references, computed once per problem and transformation."""

    cache: dict = field(default_factory=dict)

    def get(self, problem: Problem, transformation: str):
        key = (problem, transformation)
        if key not in self.cache:
            forward = ode.ForwardMode()
            self.cache[key] = TRANSFORMATIONS[transformation].reference(problem, forward)
        return self.cache[key]
