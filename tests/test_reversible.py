"""Reversible solvers and `ReversibleAdjoint`: steps undone exactly, gradients equal to
those of the same solver differentiated directly, memory independent of the number of
steps. (Every transformation order is in the composition suite, adjoint "reversible".)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode
from odesolve._solver._base import RetreatInput

A = jnp.array([1.5, 1.0, 3.0, 1.0])
Y0 = jnp.array([1.0, 1.0])


def lotka_volterra(t, y, args):
    a, b, c, d = args
    return jnp.stack([a * y[0] - b * y[0] * y[1], -c * y[1] + d * y[0] * y[1]])


PID = lambda: ode.PIDController(rtol=1e-6, atol=1e-6)


def _grads(solver, adjoint, saveat, controller, dt0=0.01, t1=4.0):
    def loss(args, y0):
        sol = ode.diffeqsolve(
            ode.ODETerm(lotka_volterra), solver, 0.0, t1, dt0, y0, args,
            saveat=saveat, stepsize_controller=controller, adjoint=adjoint, max_steps=2048,
        )  # fmt: skip
        if saveat.dense:
            return jnp.sum(sol.evaluate(jnp.linspace(0.1, t1 - 0.1, 9)) ** 2)
        return jnp.sum(sol.ys**2)

    return jax.jit(jax.grad(loss, argnums=(0, 1)))(A, Y0)


def _relative(actual, expected) -> float:
    pairs = zip(jax.tree_util.tree_leaves(actual), jax.tree_util.tree_leaves(expected))
    return max(float(jnp.max(jnp.abs(a - e)) / jnp.max(jnp.abs(e))) for a, e in pairs)


CASES = [
    # Reversible(Tsit5()) is checked in the suite against finite differences and in the
    # composition cases; against the checkpointed adjoint with -m matrix (10 s).
    pytest.param(
        ode.Reversible(ode.Tsit5()),
        ode.SaveAt(ts=jnp.linspace(0.0, 4.0, 9)),
        PID,
        marks=pytest.mark.matrix,
    ),
    # Two more wrapped methods and outputs with `-m matrix` (the suite's time).
    pytest.param(
        ode.Reversible(ode.Dopri5(), coupling=0.99),
        ode.SaveAt(steps=True),
        PID,
        marks=pytest.mark.matrix,
    ),
    pytest.param(
        ode.Reversible(ode.Bosh3()),
        ode.SaveAt(t1=True),
        ode.ConstantStepSize,
        marks=pytest.mark.matrix,
    ),
    (ode.ReversibleHeun(), ode.SaveAt(dense=True), lambda: ode.PIDController(rtol=1e-4, atol=1e-4)),
    (ode.LeapfrogMidpoint(), ode.SaveAt(ts=jnp.linspace(0.0, 4.0, 9)), ode.ConstantStepSize),
    pytest.param(
        ode.Reversible(ode.Kvaerno3()), ode.SaveAt(t1=True), PID, marks=pytest.mark.matrix
    ),
]


@pytest.mark.parametrize("solver, saveat, controller", CASES, ids=lambda x: type(x).__name__)
def test_gradients_equal_the_checkpointed_adjoint_of_the_same_solver(solver, saveat, controller):
    # Against the taped checkpointed adjoint, which equals forward mode to 1e-15 on these
    # solves. Not against DirectAdjoint: its program rounds differently, and on
    # Reversible(Dopri5(), coupling=0.99) saving every step that moves the steps it
    # takes (its own solve's step times sum 4e-5 away, the loss 2e-7 relative), so its
    # gradient, exact for that solve, is 1e-6 from the others.
    expected = _grads(solver, ode.RecursiveCheckpointAdjoint(), saveat, controller())
    actual = _grads(solver, ode.ReversibleAdjoint(), saveat, controller())
    assert _relative(actual, expected) < 1e-8


def test_gradient_matches_finite_differences():
    solver, saveat = ode.Reversible(ode.Tsit5()), ode.SaveAt(t1=True)
    loss = lambda a: jnp.sum(
        ode.diffeqsolve(
            ode.ODETerm(lotka_volterra), solver, 0.0, 2.0, 0.01, Y0, a,
            saveat=saveat, adjoint=ode.ReversibleAdjoint(),
        ).ys ** 2
    )  # fmt: skip
    grad = jax.grad(loss)(A)
    eps = 1e-6
    for i in range(4):
        e = jnp.zeros(4).at[i].set(eps)
        fd = (loss(A + e) - loss(A - e)) / (2 * eps)
        np.testing.assert_allclose(grad[i], fd, rtol=1e-6)


@pytest.mark.matrix  # 12 s; the composition suite differentiates the reversible adjoint too
def test_a_neural_ode_gradient_equals_the_direct_adjoint():
    keys = jax.random.split(jax.random.key(0), 2)
    params = {
        "w1": jax.random.normal(keys[0], (16, 4)) / 2,
        "b1": jnp.zeros(16),
        "w2": jax.random.normal(keys[1], (4, 16)) / 4,
    }
    field = lambda t, y, p: p["w2"] @ jnp.tanh(p["w1"] @ y + p["b1"])

    def loss(p, adjoint):
        sol = ode.diffeqsolve(
            ode.ODETerm(field), ode.Reversible(ode.Tsit5()), 0.0, 3.0, 0.05, jnp.ones(4), p,
            saveat=ode.SaveAt(ts=jnp.linspace(0.0, 3.0, 7)), stepsize_controller=PID(),
            adjoint=adjoint,
        )  # fmt: skip
        return jnp.sum(sol.ys**2)

    expected = jax.grad(loss)(params, ode.DirectAdjoint())
    actual = jax.grad(loss)(params, ode.ReversibleAdjoint())
    assert _relative(actual, expected) < 1e-8


@pytest.mark.parametrize("coupling, tolerance", [(1.0, 1e-9), (0.999, 1e-7)])
def test_a_thousand_steps_are_undone(coupling, tolerance):
    solver = ode.Reversible(ode.Tsit5(), coupling=coupling)
    ts = jnp.linspace(0.0, 10.0, 1001)
    pairs = jnp.stack([ts[:-1], ts[1:]], axis=1)

    term = ode.ODETerm(lotka_volterra)

    def forward(carry, t):  # Diffrax's low-level step
        y, _, _, z, _ = solver.step(term, t[0], t[1], carry[0], A, carry[1], False)
        return (y, z), None

    def backward(carry, t):
        y1, z1 = carry
        undo = RetreatInput(vf=lotka_volterra, t0=t[0], h=t[1] - t[0], y1=y1, state1=z1, args=A)
        y, z, _ = solver.retreat(undo)
        return (y, z), None

    @jax.jit
    def there_and_back():
        end, _ = jax.lax.scan(forward, (Y0, Y0), pairs)
        return jax.lax.scan(backward, end, pairs[::-1])[0]

    y, z = there_and_back()
    np.testing.assert_allclose(y, Y0, rtol=tolerance)
    np.testing.assert_allclose(z, Y0, rtol=tolerance)


def test_an_unstable_reverse_sweep_raises_rather_than_returning_a_wrong_gradient():
    # Each undone step multiplies rounding errors by about 1/coupling: 0.5^-400.
    solver = ode.Reversible(ode.Tsit5(), coupling=0.5)

    def loss(args):
        sol = ode.diffeqsolve(
            ode.ODETerm(lotka_volterra), solver, 0.0, 4.0, 0.01, Y0, args,
            adjoint=ode.ReversibleAdjoint(),
        )  # fmt: skip
        return jnp.sum(sol.ys**2)

    with pytest.raises(RuntimeError, match="coupling=1.0"):
        jax.block_until_ready(jax.jit(jax.grad(loss))(A))


@pytest.mark.parametrize("base, order", [(ode.Heun(), 2), (ode.Tsit5(), 5)])
def test_a_reversible_solver_keeps_its_base_order(base, order):
    term = ode.ODETerm(lambda t, y, args: -y + jnp.sin(t))
    exact = lambda t: 1.5 * jnp.exp(-t) + 0.5 * (jnp.sin(t) - jnp.cos(t))
    errors = []
    for dt in (0.1, 0.05):
        sol = ode.diffeqsolve(term, ode.Reversible(base), 0.0, 2.0, dt, jnp.asarray(1.0))
        errors.append(float(jnp.abs(sol.ys[-1] - exact(2.0))))
    assert np.log2(errors[0] / errors[1]) > order - 0.4


SAVE_AT_T1 = pytest.param(ode.SaveAt(t1=True), marks=pytest.mark.matrix, id="t1")


SAVE_AT_TS = pytest.param(ode.SaveAt(ts=jnp.linspace(0, 1, 5)), marks=pytest.mark.matrix, id="ts")


@pytest.mark.parametrize("saveat", [SAVE_AT_TS, SAVE_AT_T1])  # 10 s each
def test_memory_with_constant_steps_does_not_grow_with_the_number_of_steps(saveat):
    """1,000 and 100,000 steps take the same memory: nothing is kept per step (a step's
    times and counters are rebuilt from the carry after it); keeping even one float a
    step would add 800 KB."""

    def temp_bytes(n: int) -> int:
        def loss(a):
            sol = ode.diffeqsolve(
                ode.ODETerm(lotka_volterra), ode.Reversible(ode.Tsit5()), 0.0, 1.0, 1.0 / n,
                Y0, a, saveat=saveat, adjoint=ode.ReversibleAdjoint(), max_steps=n,
            )  # fmt: skip
            return jnp.sum(sol.ys**2)

        compiled = jax.jit(jax.grad(loss)).lower(A).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    assert temp_bytes(100_000) <= temp_bytes(1_000) + 1024


def _field_calls_per_reverse_step(saveat) -> float:
    """Evaluations of the field per step of a gradient's reverse sweep (the difference
    between 40 and 20 constant steps, as the forward sweep's are the same whatever is
    saved)."""
    calls = [0]

    def field(t, y, args):
        jax.debug.callback(lambda: calls.__setitem__(0, calls[0] + 1))
        return lotka_volterra(t, y, args)

    def loss(args, dt0):
        sol = ode.diffeqsolve(
            ode.ODETerm(field), ode.Reversible(ode.Tsit5()), 0.0, 1.0, dt0, Y0, args,
            saveat=saveat, adjoint=ode.ReversibleAdjoint(), max_steps=64,
        )  # fmt: skip
        return jnp.sum(sol.ys**2)

    gradient = jax.jit(jax.grad(loss))
    counts = []
    for dt0 in (1 / 20, 1 / 40):
        calls[0] = 0
        jax.block_until_ready(gradient(A, dt0))
        jax.effects_barrier()
        counts.append(calls[0])
    return (counts[1] - counts[0]) / 20


@pytest.mark.matrix  # 17 s on one core
def test_a_step_is_undone_once_where_its_interpolant_is_rebuilt():
    """Saving at times carries the last step's interpolant, which the reverse sweep
    rebuilds by undoing the step before; that undo also gives the state before the
    step before, so no step is undone twice: the reverse step costs less than one more
    undo (13 evaluations for Reversible(Tsit5())) over a solve that saves only y(t1)."""
    undo_calls = [0]

    def field(t, y, args):
        jax.debug.callback(lambda: undo_calls.__setitem__(0, undo_calls[0] + 1))
        return lotka_volterra(t, y, args)

    undo = RetreatInput(vf=field, t0=0.0, h=0.1, y1=Y0, state1=Y0, args=A)
    jax.block_until_ready(ode.Reversible(ode.Tsit5()).retreat(undo))
    jax.effects_barrier()
    assert undo_calls[0] == 13
    with_row = _field_calls_per_reverse_step(ode.SaveAt(ts=jnp.linspace(0, 1, 5)))
    without_row = _field_calls_per_reverse_step(ode.SaveAt(t1=True))
    assert with_row - without_row < undo_calls[0]


def test_reversible_solutions_match_the_base_method():
    term = ode.ODETerm(lotka_volterra)
    solve = lambda solver: ode.diffeqsolve(
        term, solver, 0.0, 4.0, 0.01, Y0, A, saveat=ode.SaveAt(ts=jnp.linspace(0.0, 4.0, 9)),
        stepsize_controller=ode.PIDController(rtol=1e-8, atol=1e-8),
    )  # fmt: skip
    np.testing.assert_allclose(
        solve(ode.Reversible(ode.Tsit5())).ys, solve(ode.Tsit5()).ys, rtol=1e-6, atol=1e-6
    )


@pytest.mark.matrix  # heavy: runs with -m matrix
def test_a_solve_starting_on_a_jump_of_the_field_never_returns_a_wrong_gradient():
    # y0[0] is exactly at the jump: the rebuilt y0[0] is within rounding of it, on either
    # side, and from the wrong side the step undone is not the step taken.
    field = lambda t, y, args: jnp.where(y[0] > 1.0, 1.0, 0.8) * lotka_volterra(t, y, args)

    def gradient(adjoint):
        def loss(args):
            sol = ode.diffeqsolve(
                ode.ODETerm(field), ode.Reversible(ode.Tsit5()), 0.0, 1.0, 0.05, Y0, args,
                adjoint=adjoint,
            )  # fmt: skip
            return jnp.sum(sol.ys**2)

        return jax.block_until_ready(jax.jit(jax.grad(loss))(A))

    expected = gradient(ode.RecursiveCheckpointAdjoint())
    try:
        actual = gradient(ode.ReversibleAdjoint())
    except RuntimeError as error:  # the solve says so...
        assert "did not rebuild the initial state" in str(error)
    else:  # ...or the rounding landed on the side taken
        assert _relative(actual, expected) < 1e-8


def test_unsupported_combinations_are_refused_clearly():
    term = ode.ODETerm(lotka_volterra)
    with pytest.raises(ValueError, match=r"solver=Reversible\(Tsit5\(\)\)"):
        ode.diffeqsolve(term, ode.Tsit5(), 0.0, 1.0, 0.1, Y0, A, adjoint=ode.ReversibleAdjoint())
    with pytest.raises(ValueError, match="jump_ts"):
        ode.diffeqsolve(
            term, ode.ReversibleHeun(), 0.0, 1.0, 0.1, Y0, A, adjoint=ode.ReversibleAdjoint(),
            stepsize_controller=ode.PIDController(rtol=1e-6, atol=1e-6, jump_ts=[0.5]),
        )  # fmt: skip
    with pytest.raises(TypeError, match="Runge-Kutta solver"):
        ode.Reversible(ode.ReversibleHeun())
    with pytest.raises(TypeError, match="Runge-Kutta solver"):
        ode.Reversible(ode.HalfSolver(ode.Tsit5()))
    with pytest.raises(ValueError, match=r"coupling=0"):
        ode.Reversible(ode.Tsit5(), coupling=0)
    with pytest.raises(TypeError, match="coupling"):
        ode.Reversible(ode.Tsit5(), coupling="high")


def _decay(t, y, args):
    return -jnp.array([1.0, 10.0]) * y + jnp.sin(t)


def _decay_exact(t):
    a = jnp.array([1.0, 10.0])
    forced = (a * jnp.sin(t) - jnp.cos(t)) / (a**2 + 1)
    return (1 + 1 / (a**2 + 1)) * jnp.exp(-a * t) + forced


@pytest.mark.parametrize("rtol", [1e-4, 1e-7])
def test_an_adaptive_reversible_solve_of_a_decaying_field_keeps_its_tolerance(rtol):
    # The gap between a reversible step's two states grows where the field is dissipative;
    # unchecked, this solve ended 2e10 (rtol 1e-4) and 6e17 (1e-7) tolerances away from
    # the answer, reported as a success.
    sol = ode.diffeqsolve(
        ode.ODETerm(_decay), ode.Reversible(ode.Tsit5(), coupling=0.9), 0.0, 5.0, 0.01,
        jnp.ones(2), stepsize_controller=ode.PIDController(rtol=rtol, atol=rtol),
        max_steps=4096,
    )  # fmt: skip
    exact = _decay_exact(5.0)
    assert float(jnp.max(jnp.abs(sol.ys[-1] - exact) / (rtol + rtol * jnp.abs(exact)))) < 3


def test_a_reversible_solve_that_cannot_keep_its_tolerance_says_so():
    # With coupling 0.999 the gap is damped too slowly for a decay rate of 10 unless steps
    # are ~1e-4 long: the solve runs out of steps and raises, rather than succeed wrongly.
    with pytest.raises(ode.SolveError, match="max_steps"):
        ode.diffeqsolve(
            ode.ODETerm(_decay), ode.Reversible(ode.Tsit5()), 0.0, 5.0, 0.01, jnp.ones(2),
            stepsize_controller=ode.PIDController(rtol=1e-6, atol=1e-6), max_steps=1024,
        )  # fmt: skip
