"""A taped emit keeps only the part of the carry its reversal reads.

An emit interpolates the step before it, linearly in the step's dense vectors when its
times are not differentiated: its tape row then holds the times and counters, not the
vectors, and leaves the tape to the steps' residuals. Where the times are differentiated,
or the saved function is not linear in the state, the row keeps what the VJP reads. The
gradients are checked against `DirectAdjoint` (autodiff through the unrolled loop) with
schedules that tape every tick and that re-tape short segments.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode
from adjoints._residuals import tape_rows

N = 16
A = (np.eye(N) * -2.0 + np.tri(N, k=1).T * 0.3 - np.tri(N, k=-2) * 0.2).astype(np.float64)
TS = np.linspace(0.0, 1.0, 9)


def _field(t, y, args):
    return jnp.tanh(args @ y)


def _solve(args, y0, ts=TS, adjoint=None, fn=None):
    extra = {} if fn is None else dict(fn=fn)
    return ode.diffeqsolve(
        ode.ODETerm(_field),
        ode.Tsit5(),
        0.0,
        1.0,
        0.1,
        y0,
        args,
        saveat=ode.SaveAt(ts=ts, **extra),
        stepsize_controller=ode.PIDController(rtol=1e-7, atol=1e-7),
        adjoint=adjoint or ode.RecursiveCheckpointAdjoint(),
    ).ys


def _rows_of(monkeypatch, solve, *inputs):
    """The taping rows the default adjoint sizes for the solve, and its online slots."""
    seen = []
    choose = ode.RecursiveCheckpointAdjoint.choose_schedule

    def recording(self, loop, init, params=None, diff=None, batch_size=1):
        if params is not None:
            seen.append(
                (tape_rows(loop, params, diff, init), tape_rows(loop, params, diff, init, True))
            )
        return choose(self, loop, init, params, diff, batch_size)

    monkeypatch.setattr(ode.RecursiveCheckpointAdjoint, "choose_schedule", recording)
    jax.jit(jax.grad(solve)).trace(*inputs)
    (found,) = seen
    return found


def _y0():
    return jnp.linspace(-1.0, 1.0, N)


def test_an_emit_on_static_times_keeps_no_dense_vectors(monkeypatch):
    loss = lambda a: jnp.sum(_solve(a, _y0()) ** 2)
    (layout, taped), (_, online) = _rows_of(monkeypatch, loss, jnp.asarray(A))
    emit_floats = taped.carry_packing.sizes()[0]
    carry_floats = online.carry_packing.sizes()[0]
    # The carry holds the state, the first stage and the row's start and seven vectors;
    # the emit's row none of them, only times.
    assert carry_floats >= 10 * N
    assert emit_floats < N
    # A row is then the step's residuals (six stage inputs), not a carry.
    assert taped.float_width == layout.packing.sizes()[0]


def test_an_emit_on_differentiated_times_keeps_what_moving_them_reads(monkeypatch):
    loss = lambda ts: jnp.sum(_solve(jnp.asarray(A), _y0(), ts) ** 2)
    (_, taped), _ = _rows_of(monkeypatch, loss, jnp.asarray(TS))
    # Moving a save time moves its value along the slope: the dense vectors are read.
    assert taped.carry_packing.sizes()[0] >= 7 * N


def _nonlinear(t, y, args):
    return jnp.sin(y) * y[0]


# Re-taped segments reverse each segment from the tape, so they cover both sweeps; a
# tape of every tick is the heavier repeat.
SCHEDULES = [
    pytest.param(ode.Tape(), id="tape", marks=pytest.mark.matrix),
    pytest.param(ode.Segments(length=2), id="segments-2"),
]


# A nonlinear `SaveAt(fn=...)` keeps more of an emit's carry than a linear save, and its
# gradient with respect to the field's weights runs through both: it stays in the suite;
# the weights alone and the save times (whose rows keep the whole carry) run with -m matrix.
WITH_RESPECT_TO = [
    pytest.param("args", marks=pytest.mark.matrix),
    pytest.param("ts", marks=pytest.mark.matrix),
    "fn",
]


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("wrt", WITH_RESPECT_TO)
def test_gradients_through_reduced_emit_rows_match_the_unrolled_loop(schedule, wrt):
    adjoint = ode.RecursiveCheckpointAdjoint(schedule=schedule)
    y0 = _y0()

    def loss(x, adjoint):
        if wrt == "args":
            ys = _solve(x, y0, adjoint=adjoint)
        elif wrt == "ts":
            ys = _solve(jnp.asarray(A), y0, x, adjoint=adjoint)
        else:
            ys = _solve(x, y0, adjoint=adjoint, fn=_nonlinear)
        return jnp.sum(jnp.cos(ys) * jnp.arange(ys.size, dtype=ys.dtype).reshape(ys.shape))

    x = jnp.asarray(TS[1:]) if wrt == "ts" else jnp.asarray(A)
    ours = jax.jit(jax.grad(lambda x: loss(x, adjoint)))(x)
    reference = jax.jit(jax.grad(lambda x: loss(x, ode.DirectAdjoint())))(x)
    np.testing.assert_allclose(ours, reference, rtol=1e-9, atol=1e-11)


@pytest.mark.matrix  # the suite's batched gradients cover taped saves under `vmap`
def test_batched_gradients_through_reduced_emit_rows_match_the_unrolled_loop():
    y0s = jnp.stack([_y0() * s for s in (0.5, 1.0, 1.5)])

    def loss(a, adjoint):
        ys = jax.vmap(lambda y0: _solve(a, y0, adjoint=adjoint))(y0s)
        return jnp.sum(jnp.cos(ys))

    adjoint = ode.RecursiveCheckpointAdjoint(schedule=ode.Segments(length=3))
    ours = jax.jit(jax.grad(lambda a: loss(a, adjoint)))(jnp.asarray(A))
    reference = jax.jit(jax.grad(lambda a: loss(a, ode.DirectAdjoint())))(jnp.asarray(A))
    np.testing.assert_allclose(ours, reference, rtol=1e-9, atol=1e-11)
