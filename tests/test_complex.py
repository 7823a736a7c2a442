"""Complex states (Schrodinger-type equations): solutions against the matrix exponential,
and gradients of real losses by every adjoint against central differences, in JAX's
convention for a complex input (grad = d/d(real part) - i d/d(imaginary part))."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

import odesolve as ode

H = jnp.array([[1.0, 0.5], [0.5, -1.0]], jnp.complex128)
Y0 = jnp.array([1.0 + 0.0j, 0.5j])
EXACT = scipy.linalg.expm(-1j * np.asarray(H)) @ np.asarray(Y0)
# (conftest sets strict dtype promotion: real and complex values are combined explicitly.)
as_complex = lambda x: jnp.asarray(x).astype(jnp.complex128)
PID = ode.PIDController(rtol=1e-10, atol=1e-10)


DIRECT = ode.DirectAdjoint()


def schrodinger(t, y, strength):
    return -1j * as_complex(strength) * (H @ y)


def nonlinear(t, y, strength):
    # Not holomorphic (|y|^2): implicit solvers must not assume it is.
    return schrodinger(t, y, strength) - 0.3 * as_complex(jnp.abs(y) ** 2) * y


def solve(solver, y0=Y0, strength=1.0, field=schrodinger, dt0=None, **kwargs):
    kwargs.setdefault("stepsize_controller", PID)
    return ode.diffeqsolve(
        ode.ODETerm(field), solver, 0.0, 1.0, dt0, y0, strength, max_steps=8192, **kwargs
    )


@pytest.mark.parametrize(
    "solver", [ode.Tsit5(), ode.Dopri5(), ode.Dopri8(), ode.Kvaerno5()], ids=type
)
def test_solution_matches_the_matrix_exponential(solver):
    saveat = ode.SaveAt(ts=jnp.array([0.5, 1.0]), dense=True)
    sol = solve(solver, saveat=saveat)
    assert sol.ys.dtype == jnp.complex128
    np.testing.assert_allclose(sol.ys[-1], EXACT, atol=1e-8)
    half = scipy.linalg.expm(-0.5j * np.asarray(H)) @ np.asarray(Y0)
    np.testing.assert_allclose(sol.ys[0], half, atol=1e-8)
    np.testing.assert_allclose(sol.evaluate(0.5), half, atol=1e-8)


def test_fixed_steps_converge_at_the_solvers_order():
    errors = [
        np.max(np.abs(solve(ode.Heun(), stepsize_controller=ode.ConstantStepSize(), dt0=dt)
                      .ys[-1] - EXACT))
        for dt in (0.02, 0.01)
    ]  # fmt: skip
    np.testing.assert_allclose(errors[0] / errors[1], 4.0, rtol=0.05)


ADJOINTS = [
    ode.RecursiveCheckpointAdjoint(),
    ode.RecursiveCheckpointAdjoint(checkpoints=3),
    ode.DirectAdjoint(),
    ode.BacksolveAdjoint(),
]


def _population(strength, solver, adjoint, field=nonlinear):
    """A real loss of a complex solution: the population of the second level."""
    sol = solve(solver, strength=strength, field=field, adjoint=adjoint)
    return jnp.abs(sol.ys[-1, 1]) ** 2


@pytest.mark.parametrize(
    "solver",
    [
        pytest.param(ode.Tsit5(), marks=pytest.mark.matrix),  # 14 s
        pytest.param(ode.Kvaerno5(), marks=pytest.mark.matrix),
    ],
    ids=type,
)
def test_gradient_of_a_real_parameter_by_every_adjoint(solver):
    forward = jax.jacfwd(_population)(1.0, solver, ode.ForwardMode())
    h = 1e-5
    central = (_population(1 + h, solver, ode.DirectAdjoint())
               - _population(1 - h, solver, ode.DirectAdjoint())) / (2 * h)  # fmt: skip
    np.testing.assert_allclose(forward, central, rtol=1e-6)
    for adjoint in ADJOINTS:
        gradient = jax.grad(_population)(1.0, solver, adjoint)
        # Backsolve solves the adjoint equation: as accurate as its tolerances.
        rtol = 1e-6 if isinstance(adjoint, ode.BacksolveAdjoint) else 1e-10
        np.testing.assert_allclose(gradient, forward, rtol=rtol)


def test_gradient_with_respect_to_a_complex_initial_state():
    weight = 0.3 - 0.7j
    loss = lambda y0, adjoint: jnp.real(
        as_complex(weight) * solve(ode.Tsit5(), y0, adjoint=adjoint).ys[-1, 1]
    )
    h = 1e-6
    expected = []
    for i in range(2):
        d_re = (loss(Y0.at[i].add(h), DIRECT) - loss(Y0.at[i].add(-h), DIRECT)) / (2 * h)
        d_im = (loss(Y0.at[i].add(1j * h), DIRECT) - loss(Y0.at[i].add(-1j * h), DIRECT)) / (2 * h)
        expected.append(as_complex(d_re) - 1j * as_complex(d_im))
    for adjoint in (ode.RecursiveCheckpointAdjoint(), ode.DirectAdjoint()):
        np.testing.assert_allclose(jax.grad(loss)(Y0, adjoint), expected, rtol=1e-7)


@pytest.mark.matrix  # a real parameter by every adjoint stays in the suite
def test_gradients_in_every_transformation_order():
    strengths = jnp.array([0.8, 1.0, 1.3])
    solver, adjoint = ode.Tsit5(), ode.RecursiveCheckpointAdjoint()
    per_sample = jax.vmap(jax.grad(_population), in_axes=(0, None, None))(
        strengths, solver, adjoint
    )
    one_at_a_time = [jax.grad(_population)(s, solver, adjoint) for s in strengths]
    np.testing.assert_allclose(per_sample, one_at_a_time, rtol=1e-12)
    batch = jax.vmap(lambda s: _population(s, solver, adjoint))
    np.testing.assert_allclose(jax.jacrev(batch)(strengths), np.diag(one_at_a_time), atol=1e-12)
    of_sum = jax.grad(lambda s: jnp.sum(batch(s)))(strengths)
    np.testing.assert_allclose(of_sum, one_at_a_time, rtol=1e-12)
    tangent = jax.jit(jax.jvp, static_argnums=0)(
        lambda s: _population(s, solver, ode.DirectAdjoint()), (1.0,), (1.0,)
    )[1]
    np.testing.assert_allclose(tangent, one_at_a_time[1], rtol=1e-10)


def test_a_state_of_real_and_complex_leaves():
    def field(t, y, args):
        amplitude, phase = y
        return schrodinger(t, amplitude, 1.0), jnp.sum(jnp.abs(amplitude) ** 2)

    sol = ode.diffeqsolve(
        ode.ODETerm(field), ode.Tsit5(), 0.0, 1.0, None, (Y0, jnp.asarray(0.0)),
        stepsize_controller=PID,
    )  # fmt: skip
    amplitude, norm_integral = sol.ys
    assert amplitude.dtype == jnp.complex128 and norm_integral.dtype == jnp.float64
    np.testing.assert_allclose(amplitude[-1], EXACT, atol=1e-8)
    np.testing.assert_allclose(norm_integral[-1], 1.25, rtol=1e-8)  # |y|^2 is conserved


# One of each kind of step in CI (tableau, implicit, carried state, wrapper); the rest
# with `-m matrix`.
_heavy = lambda solver: pytest.param(solver, marks=pytest.mark.matrix)
ALL_SOLVERS = [
    ode.Tsit5(), ode.Kvaerno3(), ode.ReversibleHeun(), ode.LeapfrogMidpoint(),
    ode.Reversible(ode.Tsit5()),
    *map(_heavy, [ode.Euler(), ode.Heun(), ode.Midpoint(), ode.Ralston(), ode.Bosh3(),
                  ode.Dopri5(), ode.Dopri8(), ode.ImplicitEuler(), ode.HalfSolver(ode.Tsit5())]),
]  # fmt: skip


@pytest.mark.parametrize(
    "solver", ALL_SOLVERS, ids=lambda s: type(getattr(s, "values", [s])[0]).__name__
)
def test_every_solver_steps_a_complex_state(solver):
    # Strict promotion (conftest) catches any step that mixes the real step size with
    # the complex state implicitly; the dense output and save times go through it too.
    sol = solve(
        solver, stepsize_controller=ode.ConstantStepSize(), dt0=1e-3,
        saveat=ode.SaveAt(ts=jnp.array([0.5, 1.0]), dense=True),
    )  # fmt: skip
    assert sol.ys.dtype == jnp.complex128
    np.testing.assert_allclose(sol.ys[-1], EXACT, atol=2e-3)
    np.testing.assert_allclose(sol.evaluate(1.0), EXACT, atol=2e-3)


@pytest.mark.matrix  # 15 s: the reversible adjoint's reverse sweep compiles slowly
def test_an_event_on_a_complex_state_and_the_reversible_adjoint():
    # The population of the first level falls to 0.9: located on the complex dense output.
    event = ode.Event(lambda t, y, args, **kw: jnp.abs(y[0]) ** 2 - 0.9)

    def crossing(strength, adjoint):
        sol = solve(
            ode.Reversible(ode.Tsit5(), coupling=1.0), strength=strength, event=event,
            adjoint=adjoint,
        )  # fmt: skip
        return sol.ts[-1]

    direct = jax.grad(crossing)(1.0, DIRECT)
    reversible = jax.grad(crossing)(1.0, ode.ReversibleAdjoint())
    np.testing.assert_allclose(reversible, direct, rtol=1e-8)
    h = 1e-6
    central = (crossing(1 + h, DIRECT) - crossing(1 - h, DIRECT)) / (2 * h)
    np.testing.assert_allclose(direct, central, rtol=1e-5)


def test_a_complex_state_is_announced_as_diffrax_does():
    with pytest.warns(ode.ComplexStateWarning, match="Complex dtype"):
        solve(ode.Tsit5())
    # Not again inside a gradient by the continuous adjoint, which solves internally.
    with pytest.warns(ode.ComplexStateWarning) as said:
        jax.grad(_population)(1.0, ode.Tsit5(), ode.BacksolveAdjoint())
    assert len(said) == 1
