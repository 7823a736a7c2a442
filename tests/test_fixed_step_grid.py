"""Fixed steps land on the same grid in every program that computes a solve: plain,
under `jit`, and as the forward sweep of its gradient. A control that switches at the
grid times (a model-predictive controller's piecewise-constant input, read with
`left=False`) reads the piece Diffrax's solve reads, whether or not the solve is
differentiated, for times given as Python numbers (constants in Diffrax's program) or
as arrays (its inputs)."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode

N, DT = 20, 0.05


def _solve(lib, controls, times_as_arrays: bool):
    dtype = jnp.float32 if times_as_arrays else jnp.float64
    knots = jnp.linspace(0.0, DT * N, N + 1, dtype=dtype)
    pieces = (jnp.repeat(knots, 2)[1:-1], jnp.repeat(controls, 2, axis=0))

    def field(t, y, args):
        return lib.LinearInterpolation(*pieces).evaluate(t, left=False)

    t1, dt0 = N * DT, DT  # 1.0000000000000002 and 0.05: Python numbers
    if times_as_arrays:
        t1, dt0 = jnp.asarray(t1, dtype), jnp.asarray(dt0, dtype)
    sol = lib.diffeqsolve(
        lib.ODETerm(field), lib.Euler(), 0.0, t1, dt0, jnp.zeros(1, dtype), controls,
        saveat=lib.SaveAt(ts=knots),
    )  # fmt: skip
    return sol.ys[:, 0]


@pytest.mark.parametrize(
    "times_as_arrays",
    [False, pytest.param(True, marks=pytest.mark.matrix)],
    ids=["numbers", "arrays"],
)
def test_a_control_switched_at_grid_times_reads_the_same_piece_differentiated(times_as_arrays):
    dtype = jnp.float32 if times_as_arrays else jnp.float64
    controls = jnp.arange(N, dtype=dtype)[:, None]
    plain = _solve(ode, controls, times_as_arrays)
    np.testing.assert_array_equal(plain, _solve(diffrax, controls, times_as_arrays))
    primal, _ = jax.vjp(lambda u: _solve(ode, u, times_as_arrays), controls)
    np.testing.assert_array_equal(primal, plain)
    loss = lambda u: jnp.sum(_solve(ode, u, times_as_arrays) ** 2)
    value, _ = jax.jit(jax.value_and_grad(loss))(controls)
    np.testing.assert_array_equal(value, jnp.sum(plain**2))


def test_the_stages_at_a_steps_end_are_evaluated_at_that_end():
    # 0.07 + (0.89 - 0.07) is 0.8900000000000001: the stages at c = 1 are evaluated at
    # the step's end itself, as Diffrax evaluates them (a field with a jump there reads the
    # same side in both).
    def stage_times(lib):
        seen = []

        def field(t, y, args):
            jax.debug.callback(lambda t: seen.append(float(t)), t, ordered=True)
            return -y

        ends = jnp.array([0.07, 0.89])
        lib.diffeqsolve(
            lib.ODETerm(field), lib.Tsit5(), 0.07, 0.89, None, jnp.array([1.0]),
            stepsize_controller=lib.StepTo(ends),
        )  # fmt: skip
        jax.effects_barrier()
        return sorted(set(seen))

    ours = stage_times(ode)
    assert max(ours) == 0.89
    assert ours == stage_times(diffrax)


def test_fixed_steps_under_vmap_with_each_samples_own_interval():
    # Diffrax's latent ODE example: each sample from its own t0 to its own t1 under vmap,
    # dt0 = 0.1 not dividing them. Every sample takes its ceil((t1 - t0) / dt0) steps: a
    # grid point computed an ulp apart where it is proposed and where it is reached had
    # stalled a sample's step count and ended its solve in step_size_underflow.
    t0s = jnp.array([0.6523107290267944, 0.10599008947610855, 0.02119259722530842])
    t1s = jnp.array([2.896498680114746, 2.6632914543151855, 2.221986770629883])

    def one(t0, t1):
        saveat = ode.SaveAt(ts=jnp.linspace(t0, t1, 5))
        sol = ode.diffeqsolve(ode.ODETerm(lambda t, y, a: -y), ode.Tsit5(), t0, t1, 0.1,
                              jnp.ones(2, jnp.float32), saveat=saveat, throw=False)  # fmt: skip
        return sol.result == ode.RESULTS.successful, sol.stats["num_steps"], sol.ys[-1, 0]

    ok, steps, y1 = jax.vmap(one)(t0s.astype(jnp.float32), t1s.astype(jnp.float32))
    assert np.all(ok)
    np.testing.assert_array_equal(steps, np.ceil((t1s - t0s) / 0.1).astype(int))
    np.testing.assert_allclose(y1, np.exp(-(t1s - t0s)), rtol=1e-5)
