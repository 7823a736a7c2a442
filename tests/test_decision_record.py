"""The record of step-size decisions a recomputing reverse sweep imposes: every tick's
verdict (a bit), and the step ends of the ticks the schedule plans to recompute.

Its memory follows the schedule's budget, not `max_steps`, and a solve longer than the
planned ticks still differentiates the steps the forward sweep took."""

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode


def _decay(t, y, args):
    return -args * y + jnp.sin(3 * t)


def _final_sum(p, adjoint, max_steps=4096, dtype=jnp.float64, solver=ode.Tsit5()):
    sol = ode.diffeqsolve(
        ode.ODETerm(_decay), solver, 0.0, 3.0, 0.05, jnp.array([1.0, 2.0], dtype), p,
        saveat=ode.SaveAt(ts=jnp.linspace(0.0, 3.0, 7, dtype=dtype)),
        stepsize_controller=ode.PIDController(rtol=1e-8, atol=1e-8),
        max_steps=max_steps, adjoint=adjoint,
    )  # fmt: skip
    return jnp.sum(sol.ys**2)


@pytest.mark.matrix  # two compilations of a batched gradient: 16 s of the suite
def test_memory_grows_with_max_steps_by_a_bit_a_tick():
    # A batch of 128 shares the budget too thinly to tape every step: the default tapes
    # segments sized by the budget and thins the states kept before them, so what grows
    # with the bound is only the verdicts, a bit a tick.
    batch = 128
    ps = jnp.linspace(1.0, 2.0, batch, dtype=jnp.float32)

    def temp_bytes(max_steps: int) -> int:
        adjoint = ode.RecursiveCheckpointAdjoint()
        loss = lambda p: _final_sum(p, adjoint, max_steps, jnp.float32, ode.Heun())
        grad = jax.jit(jax.vmap(jax.grad(loss)))
        return grad.lower(ps).compile().memory_analysis().temp_size_in_bytes

    growth = temp_bytes(16384) - temp_bytes(4096)
    bits = batch * (16384 - 4096) // 8
    assert growth <= 1.1 * bits + 4096, (growth, bits)


@pytest.mark.matrix  # heavy: runs with -m matrix
@pytest.mark.parametrize("batched", [False, pytest.param(True, marks=pytest.mark.matrix)])
def test_a_solve_longer_than_the_planned_ticks_differentiates_its_own_steps(batched):
    # Segments of 4 ticks and 2 kept states plan for 8 ticks; the solve takes about 40,
    # so most ticks are recomputed with their verdict imposed and their step end made
    # again.
    segments = ode.RecursiveCheckpointAdjoint(schedule=ode.Segments(length=4, starts=2))
    ps = jnp.array([1.5, 0.7])
    grad = lambda adjoint: jax.grad(lambda p: _final_sum(p, adjoint))
    if batched:
        ours = jax.vmap(grad(segments))(ps)
        direct = jax.vmap(grad(ode.DirectAdjoint()))(ps)
    else:
        ours = jnp.stack([grad(segments)(p) for p in ps])
        direct = jnp.stack([grad(ode.DirectAdjoint())(p) for p in ps])
    np.testing.assert_allclose(ours, direct, rtol=1e-10)


def _while_carries(jaxpr) -> list[list]:
    """The carried values' types of every while loop in `jaxpr`, nested ones included."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "while":
            found.append([v.aval for v in eqn.outvars])
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found += _while_carries(sub)
    return found


def test_a_solve_that_recomputes_nothing_carries_no_imposed_verdict():
    # A verdict is imposed only on a tick a reverse sweep recomputes; a forward solve
    # carried and tested one every step, for a tenth of a small solve's time.
    solve = lambda p: _final_sum(p, ode.RecursiveCheckpointAdjoint())
    carries = _while_carries(jax.make_jaxpr(solve)(jnp.float64(0.5)).jaxpr)
    assert carries, "the solve's loop was not found"
    for carry in carries:
        assert not [a for a in carry if a.dtype == jnp.int8 and a.shape == ()], carry


def test_taped_segments_and_the_step_sizes_they_keep_share_the_budget(monkeypatch):
    # A batch of 256 small neural ODEs saved at 20 times: the default's share is 16 KiB a
    # sample. Its taped segments keep the step sizes of the ticks they plan to recompute
    # (length x starts), which count against the share beside the tape and the states.
    from adjoints._adjoint import row_bytes
    from adjoints._decisions import value_bytes

    seen = []
    choose = ode.RecursiveCheckpointAdjoint.choose_schedule

    def recording(self, loop, init, params=None, diff=None, batch_size=1):
        chosen = choose(self, loop, init, params, diff, batch_size)
        if params is not None:
            seen.append((chosen, row_bytes(loop, params, init, diff), value_bytes(loop, init)))
        return chosen

    monkeypatch.setattr(ode.RecursiveCheckpointAdjoint, "choose_schedule", recording)
    w1 = jnp.linspace(-1.0, 1.0, 32, dtype=jnp.float32).reshape(16, 2)
    field = lambda t, y, w: jnp.tanh(w.T @ jnp.tanh(w @ y))
    ts = jnp.linspace(0.0, 1.0, 20, dtype=jnp.float32)

    def loss(w, y0s):
        solve = lambda y0: ode.diffeqsolve(
            ode.ODETerm(field), ode.Tsit5(), 0.0, 1.0, 0.05, y0, w, saveat=ode.SaveAt(ts=ts),
            stepsize_controller=ode.PIDController(rtol=1e-6, atol=1e-6),
        ).ys  # fmt: skip
        return jnp.sum(jax.vmap(solve)(y0s) ** 2)

    jax.jit(jax.grad(loss)).trace(w1, jnp.ones((256, 2), jnp.float32))
    (schedule, (state, row, _, _), value), *_ = seen
    assert isinstance(schedule, ode.Segments) and schedule.starts == 8
    assert value > 0  # an adaptive step's record holds where the next step ends
    length, starts = schedule.length, schedule.starts
    kept = (length + 1) * row + (starts + 1) * state + length * starts * value
    assert kept <= 16 * 2**10
