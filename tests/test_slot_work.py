"""A step's cost under a recomputing schedule follows the ticks, not the slots.

A default budget holds tens of thousands of slots of a small state. A search of the slot
table on every tick (for the latest state, for a free slot, to release one), or a copy of
the table through a branch, made a solve of ten steps cost as much as several thousand
slots' worth of memory traffic a tick. The reverse sweep uses the slots as a stack in tick
order (`SlotTable`), and online thinning, which rewrites the table, runs in a loop
taken at most once. Checked on the traced program (work, not time): no loop body reduces
or selects over the table except that thinning loop.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import subjaxprs

import odesolve as ode
from adjoints._schedule import Online, States

_SLOTS = 3_001  # a size nothing else in the program has

# Primitives that read or write a whole array: over the slot table, work per slot.
_WHOLE = {
    "argmax", "argmin", "reduce_sum", "reduce_max", "reduce_min", "reduce_or",
    "reduce_and", "select_n", "sort", "eq", "ne", "lt", "le", "gt", "ge", "and", "or",
    "rem", "copy", "copy_p",
}  # fmt: skip


def _field(t, y, k):
    return jnp.stack([-k[0] * y[0] + y[1], k[1] * y[0] - y[1]])


def _loss(k, schedule=None, adjoint=None):
    adjoint = adjoint or ode.RecursiveCheckpointAdjoint(schedule=schedule)
    sol = ode.diffeqsolve(
        ode.ODETerm(_field), ode.Tsit5(), 0.0, 1.0, 0.01, jnp.array([1.0, 0.5]), k,
        stepsize_controller=ode.PIDController(rtol=1e-6, atol=1e-8),
        saveat=ode.SaveAt(ts=jnp.linspace(0.0, 1.0, 4)), max_steps=100_000, adjoint=adjoint,
    )  # fmt: skip
    return jnp.sum(sol.ys**2)


def _runs_at_most_once(eqn) -> bool:
    """A while loop whose predicate is its first carry, as `at_most_once` makes."""
    cond = eqn.params["cond_jaxpr"].jaxpr
    return not cond.eqns and cond.outvars[0] is cond.invars[0]


def _table_work(jaxpr, in_loop: bool, found: list) -> None:
    """Collect the primitives inside loop bodies that touch an array of `_SLOTS`."""
    for eqn in jaxpr.eqns:
        if in_loop and eqn.primitive.name in _WHOLE:
            shapes = [getattr(v.aval, "shape", ()) for v in (*eqn.invars, *eqn.outvars)]
            if any(_SLOTS in shape for shape in shapes):
                found.append(eqn.primitive.name)
        looping = in_loop or eqn.primitive.name in ("while", "scan")
        if eqn.primitive.name == "while" and _runs_at_most_once(eqn):
            continue  # thinning: its work is per slot, once per doubling of the stride
        for inner in subjaxprs(eqn):
            _table_work(inner, looping, found)


@pytest.mark.parametrize("batched", [False, True])
def test_no_loop_body_searches_or_copies_the_slot_table(batched):
    loss = lambda k: _loss(k, States(slots=_SLOTS))
    k = jnp.array([0.7, 1.3])
    if batched:
        grad, k = jax.vmap(jax.grad(loss)), jnp.stack([k, 1.1 * k])
    else:
        grad = jax.grad(loss)
    found: list = []
    _table_work(jax.make_jaxpr(grad)(k).jaxpr, False, found)
    assert found == []


@pytest.mark.matrix  # thinning and the stack are also in test_schedules' exact orders
def test_gradient_with_a_large_table_equals_forward_mode():
    # Thinned (3 slots: the stack reordered by thinning) and not (3,001), bare states and
    # states with residuals, and the default.
    k = jnp.array([0.7, 1.3])
    forward = jax.jacfwd(lambda k: _loss(k, adjoint=ode.ForwardMode()))(k)
    for schedule in (States(slots=_SLOTS), States(slots=3), Online(slots=3), None):
        got = jax.jit(jax.grad(_loss), static_argnums=1)(k, schedule)
        np.testing.assert_allclose(got, forward, rtol=1e-9, err_msg=str(schedule))
