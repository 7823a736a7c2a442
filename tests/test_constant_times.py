"""Times that nothing differentiated places (concrete t0, t1 and dt0, or traced ones not
differentiated) carry no cotangent: reverse mode treats the step times, the controller's
state, the interpolation row's start and the next save times as constants, and carries
cotangents for the state and the solver's state alone. Gradients stay those of
`DirectAdjoint` (JAX's own autodiff through a scan)."""

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest

import odesolve as ode

Y0 = jnp.array([1.0, 0.5])
SAVE_TS = jnp.linspace(0.0, 2.0, 5)


def field(t, y, args):
    return jnp.stack([args * y[1], -y[0] + jnp.sin(t) * y[1]])


class _Recording(ode.RecursiveCheckpointAdjoint):
    """The default adjoint, keeping the carry leaves its reverse sweep differentiates."""

    def run_loop(self, loop, params, init, buffers, problem=None):
        differentiated = loop if loop.fixed_times is None else loop.fixed_times
        floats = jtu.tree_leaves(differentiated.split(init)[0])
        _SEEN.append(sorted(x.shape for x in floats))
        return super().run_loop(loop, params, init, buffers, problem)


_SEEN: list = []


def _loss(adjoint, controller, t1):
    def loss(y0, rate):
        sol = ode.diffeqsolve(
            ode.ODETerm(field), ode.Tsit5(), 0.0, t1, 0.05, y0, rate,
            stepsize_controller=controller, saveat=ode.SaveAt(ts=SAVE_TS * t1 / 2.0),
            adjoint=adjoint, max_steps=256,
        )  # fmt: skip
        return jnp.sum(sol.ys**2)

    return loss


@pytest.mark.parametrize(
    "controller, t1",
    [("pid", "traced")]  # the others with -m matrix
    + [pytest.param(c, t, marks=pytest.mark.matrix) for c, t in [("pid", "concrete")]]
    + [pytest.param("constant", "concrete", marks=pytest.mark.matrix)]
    + [pytest.param("constant", "traced", marks=pytest.mark.matrix)],
)
def test_times_nothing_differentiated_places_carry_no_cotangent(controller, t1):
    controller = dict(constant=ode.ConstantStepSize(), pid=ode.PIDController(rtol=1e-8, atol=1e-8))[
        controller
    ]
    _SEEN.clear()

    def gradient(adjoint, end):
        return jax.grad(_loss(adjoint, controller, end), argnums=(0, 1))(Y0, 0.8)

    if t1 == "concrete":
        ours = gradient(_Recording(), 2.0)
        reference = gradient(ode.DirectAdjoint(), 2.0)
    else:  # traced by jit, not differentiated
        ours = jax.jit(lambda end: gradient(_Recording(), end))(2.0)
        reference = jax.jit(lambda end: gradient(ode.DirectAdjoint(), end))(2.0)
    # The state, Tsit5's carried first stage, the interpolation row's state and its seven
    # stages as one array: no time, step size or controller state (scalars).
    assert _SEEN == [[(2,), (2,), (2,), (7, 2)]]
    for a, b in zip(ours, reference):
        np.testing.assert_allclose(a, b, rtol=1e-10)


def test_a_differentiated_end_time_keeps_its_cotangents():
    # With t1 differentiated, the times depend on it: their cotangents are carried, and
    # the derivative matches central differences of the solve itself.
    controller = ode.PIDController(rtol=1e-10, atol=1e-10)
    loss = lambda end: _loss(ode.RecursiveCheckpointAdjoint(), controller, end)(Y0, 0.8)
    step = 1e-5
    central = (loss(2.0 + step) - loss(2.0 - step)) / (2 * step)
    np.testing.assert_allclose(jax.grad(loss)(2.0), central, rtol=1e-5)
