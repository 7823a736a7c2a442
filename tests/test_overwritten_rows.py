"""Reverse mode through a loop that overwrites output rows: an overwritten write gets no
cotangent, under every schedule and under `vmap`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode
from adjoints._loop import Loop, Write

jax.config.update("jax_enable_x64", True)


def _overwriting_loop() -> Loop:
    """x <- a x four times; after each step an emit writes x to row 0 (steps 1 and 2) or
    row 1 (steps 3 and 4), so the rows end as x0 a**2 and x0 a**4."""

    def body(a, c):
        return dict(x=c["x"] * a, n=c["n"] + 1, due=jnp.asarray(True))

    def emit(a, c):
        row = jnp.where(c["due"], jnp.where(c["n"] <= 2, 0, 1), 2).astype(jnp.int32)
        return dict(c, due=jnp.asarray(False)), (Write(row, c["x"]),)

    return Loop(
        cond=lambda a, c: c["n"] < 4,
        body=body,
        pending=lambda c: c["due"],
        emit=emit,
        max_steps=4,
        max_emits=4,
    )


def _loss(adjoint, a, x0):
    init = dict(x=x0, n=jnp.int32(0), due=jnp.asarray(False))
    buffers = (jnp.zeros(3, x0.dtype),)
    _, (rows,) = adjoint.run_loop(_overwriting_loop(), a, init, buffers)
    return rows[0] + 2 * rows[1]


SCHEDULES = [
    None,  # tapes every step here, as Tape() does (with -m matrix)
    pytest.param(ode.Tape(), marks=pytest.mark.matrix),
    ode.Segments(length=2),
    # Online slots hold residual rows as the tape and segments do (with -m matrix).
    pytest.param(ode.Online(checkpoints=2), marks=pytest.mark.matrix),
    # States recompute from kept states: its reverse sweep runs in the suite in
    # test_states_before_steps.py and test_schedules.py (with -m matrix here).
    pytest.param(ode.States(checkpoints=2), marks=pytest.mark.matrix),
]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: type(s).__name__)
def test_an_overwritten_row_gets_no_cotangent(schedule):
    adjoint = ode.RecursiveCheckpointAdjoint(schedule=schedule)
    a, x0 = jnp.float64(1.3), jnp.float64(0.7)
    expected = 2 * x0 * a + 8 * x0 * a**3  # d/da (x0 a**2 + 2 x0 a**4)
    assert np.isclose(jax.grad(_loss, 1)(adjoint, a, x0), expected, rtol=1e-12)
    a_s, x0_s = jnp.array([1.3, 0.9, 1.1]), jnp.array([0.7, 1.2, -0.4])
    per_sample = jax.vmap(jax.grad(_loss, 1), (None, 0, 0))(adjoint, a_s, x0_s)
    np.testing.assert_allclose(per_sample, 2 * x0_s * a_s + 8 * x0_s * a_s**3, rtol=1e-12)
