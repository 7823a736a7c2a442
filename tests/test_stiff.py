"""Implicit (stiff) solvers: order conditions and empirical convergence order, standard
stiff problems against a tight scipy Radau reference, failure and rejection behaviour,
PyTree states, user Jacobians, and gradients through every adjoint."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate

import odesolve as ode
from odesolve._controller._base import AttemptInput, FirstStepInput
from odesolve._solver import StepContext
from odesolve._solver._runge_kutta import StagesInput

EPS = float(np.finfo(np.float64).eps)

# (solver, order of the solution)
IMPLICIT_SOLVERS = [
    (ode.ImplicitEuler(), 1),
    (ode.Kvaerno3(), 3),
    (ode.Kvaerno4(), 4),
    (ode.Kvaerno5(), 5),
]


def solver_id(entry) -> str:
    return type(entry[0]).__name__


# ------------------------------------------------------------------------ problems

RATES = (0.04, 3e7, 1e4)  # Robertson's k1, k2, k3


def robertson(t, y, k):
    """Robertson's chemical kinetics (Hairer & Wanner II, sec. IV.1): rates 4e-2, 3e7, 1e4."""
    return jnp.stack(
        [
            -k[0] * y[0] + k[2] * y[1] * y[2],
            k[0] * y[0] - k[1] * y[1] ** 2 - k[2] * y[1] * y[2],
            k[1] * y[1] ** 2,
        ]
    )


def _robertson_numpy(t, y):
    k1, k2, k3 = RATES
    return [
        -k1 * y[0] + k3 * y[1] * y[2],
        k1 * y[0] - k2 * y[1] ** 2 - k3 * y[1] * y[2],
        k2 * y[1] ** 2,
    ]


def _robertson_jacobian_numpy(t, y):
    k1, k2, k3 = RATES
    return [
        [-k1, k3 * y[2], k3 * y[1]],
        [k1, -2 * k2 * y[1] - k3 * y[2], -k3 * y[1]],
        [0.0, 2 * k2 * y[1], 0.0],
    ]


def radau(f, jac, t1, y0, ts, rtol, atol):
    """scipy's Radau IIA (order 5) at `ts`: (len(ts), n)."""
    sol = scipy.integrate.solve_ivp(
        f, (0.0, t1), y0, method="Radau", rtol=rtol, atol=atol, jac=jac, t_eval=ts
    )
    assert sol.success
    return sol.y.T


@functools.cache
def robertson_reference(t1: float):
    # Radau at rtol 1e-10 agrees with rtol 1e-13 to ~2e-15 here (checked once), at a
    # fraction of the cost.
    return radau(
        _robertson_numpy, _robertson_jacobian_numpy, t1, [1.0, 0.0, 0.0], [t1], 1e-10, 1e-22
    )[0]


def relative_errors(got, want):
    got, want = np.asarray(got), np.asarray(want)
    return np.abs(got - want) / np.abs(want)


# ------------------------------------------------------------- the methods themselves


def _order_conditions(b, a, c):
    """Residuals of the order conditions for the rooted trees of order 1..5, by order."""
    ac, ac2, aac = a @ c, a @ c**2, a @ (a @ c)
    return {
        1: [b.sum() - 1],
        2: [b @ c - 1 / 2],
        3: [b @ c**2 - 1 / 3, b @ ac - 1 / 6],
        4: [b @ c**3 - 1 / 4, b @ (c * ac) - 1 / 8, b @ ac2 - 1 / 12, b @ aac - 1 / 24],
        5: [
            b @ c**4 - 1 / 5,
            b @ (c**2 * ac) - 1 / 10,
            b @ (c * ac2) - 1 / 15,
            b @ (c * aac) - 1 / 30,
            b @ (ac * ac) - 1 / 20,
            b @ (a @ c**3) - 1 / 20,
            b @ (a @ (c * ac)) - 1 / 40,
            b @ (a @ ac2) - 1 / 60,
            b @ (a @ aac) - 1 / 120,
        ],
    }


# Order of the embedded solution the error estimate compares with: one less than the
# method's (implicit Euler's is the trapezoidal rule, of order 2), except Kvaerno4's and
# Kvaerno5's, two less (their published embeddings are too accurate to estimate the error
# with).
EMBEDDED_ORDER = {"ImplicitEuler": 2, "Kvaerno3": 2, "Kvaerno4": 2, "Kvaerno5": 3}


@pytest.mark.parametrize("entry", IMPLICIT_SOLVERS, ids=solver_id)
def test_tableau_satisfies_order_conditions(entry):
    """The solution has the claimed order and no more; the embedded solution has the order
    in EMBEDDED_ORDER and no more."""
    solver, order = entry
    tab = solver.tableau
    s = tab.num_stages
    a = np.zeros((s, s))
    for i, row in enumerate(tab.a):
        a[i + 1, : i + 1] = row
        a[i + 1, i + 1] = tab.gamma
    c, b = np.asarray(tab.c), np.asarray(tab.b)
    embedded_order = EMBEDDED_ORDER[solver_id(entry)]
    for weights, p in ((b, order), (b - np.asarray(tab.b_error), embedded_order)):
        residuals = _order_conditions(weights, a, c)
        for q in range(1, p + 1):
            assert np.max(np.abs(residuals[q])) < 1e-12, (q, residuals[q])
        if p + 1 <= 5:
            assert np.max(np.abs(residuals[p + 1])) > 1e-6


def _a3(t, y, args):
    """DETEST A3: y' = y cos t, y = exp(sin t)."""
    return y * jnp.cos(t)


@pytest.mark.parametrize("entry", IMPLICIT_SOLVERS, ids=solver_id)
def test_fixed_step_convergence_order(entry):
    """Fixed steps with the default Newton settings (no configuration)."""
    solver, order = entry
    t1 = 4.0
    # Step counts where the error is well above rounding and well in the asymptotic regime.
    base = {1: 200, 3: 20, 4: 20, 5: 16}[order]
    counts = np.array([base, 2 * base, 4 * base])

    @jax.jit
    def error(dt):
        sol = ode.diffeqsolve(
            ode.ODETerm(_a3), solver, 0.0, t1, dt, jnp.array([1.0]), max_steps=1000
        )
        return jnp.abs(sol.ys[-1, 0] - jnp.exp(jnp.sin(t1)))

    errors = np.array([float(error(jnp.asarray(t1 / n))) for n in counts])
    slope = -np.polyfit(np.log(counts), np.log(errors), 1)[0]
    assert abs(slope - order) < 0.3, (errors, slope)


# ---------------------------------------------------------------------- stiff problems

ROBERTSON_PID = ode.PIDController(rtol=1e-8, atol=1e-10)


@functools.partial(jax.jit, static_argnums=0)
def _robertson_solve(solver, t1):
    return ode.diffeqsolve(
        ode.ODETerm(robertson),
        solver,
        0.0,
        t1,
        1e-4,
        jnp.array([1.0, 0.0, 0.0]),
        jnp.array(RATES),
        stepsize_controller=ROBERTSON_PID,
        max_steps=2048,
        throw=False,
    )


@pytest.mark.parametrize("t1", [40.0, 1e5])
def test_robertson_against_radau(t1):
    sol = _robertson_solve(ode.Kvaerno5(), jnp.asarray(t1))
    errors = relative_errors(sol.ys[-1], robertson_reference(t1))
    print(
        f"Robertson to t={t1:g}: steps {dict((k, int(v)) for k, v in sol.stats.items())}, "
        f"relative errors {errors}"
    )
    assert np.max(errors) < 1e-6
    # A step count this low needs every stage solve to converge without rejections piling
    # up (Diffrax's Kvaerno5 takes ~700 steps to t=40 here, half of them rejected).
    assert int(sol.stats["num_steps"]) < 500
    assert int(sol.stats["num_rejected_steps"]) <= int(sol.stats["num_steps"]) // 10


def _van_der_pol(t, y, mu):
    return jnp.stack([y[1], mu * (1 - y[0] ** 2) * y[1] - y[0]])


def test_van_der_pol_mu_1000():
    mu, ts = 1000.0, np.array([500.0, 1000.0, 1500.0, 2000.0, 2500.0, 3000.0])
    sol = ode.diffeqsolve(
        ode.ODETerm(_van_der_pol),
        ode.Kvaerno5(),
        0.0,
        3000.0,
        1e-6,
        jnp.array([2.0, 0.0]),
        mu,
        saveat=ode.SaveAt(ts=jnp.asarray(ts)),
        stepsize_controller=ode.PIDController(rtol=1e-7, atol=1e-9),
        max_steps=4096,
    )
    want = radau(
        lambda t, y: [y[1], mu * (1 - y[0] ** 2) * y[1] - y[0]],
        lambda t, y: [[0.0, 1.0], [-2 * mu * y[0] * y[1] - 1, mu * (1 - y[0] ** 2)]],
        3000.0,
        [2.0, 0.0],
        ts,
        1e-8,
        1e-10,
    )
    print(f"Van der Pol mu=1000: steps {dict((k, int(v)) for k, v in sol.stats.items())}")
    # Two periods of relaxation oscillation amplify local errors: a phase error shows as
    # ~1e3 times the tolerance in the small component y2 (Radau's own at rtol 1e-8 is ~1e-8).
    np.testing.assert_allclose(sol.ys[:, 0], want[:, 0], rtol=1e-5)
    np.testing.assert_allclose(sol.ys[:, 1], want[:, 1], rtol=5e-4)


def test_explicit_solver_runs_out_of_steps_where_implicit_finishes():
    explicit = _robertson_solve(ode.Tsit5(), jnp.asarray(40.0))
    assert explicit.result == ode.RESULTS.max_steps_reached
    implicit = _robertson_solve(ode.Kvaerno5(), jnp.asarray(40.0))
    assert implicit.result == ode.RESULTS.successful
    assert int(implicit.stats["num_steps"]) < int(explicit.stats["max_steps"])


# ---------------------------------------------------------------- failures and options


def test_failed_newton_solve_is_an_infinite_error_and_a_factormin_shrink():
    """One step far too large for one Newton iteration per stage: the error estimate is
    +inf (not NaN), y1 stays finite, and the controller rejects and shrinks by factormin."""
    solver = ode.Kvaerno3(max_iterations=1, max_refreshes=0)
    controller = ode.PIDController(rtol=1e-6, atol=1e-8, factormin=0.2)
    y0, k = jnp.array([1.0, 0.0, 0.0]), jnp.array(RATES)
    t0, h = jnp.asarray(0.0), jnp.asarray(0.5)
    context = StepContext(controller.tolerances(), 1.0, None)

    @jax.jit
    def attempt():
        given = StagesInput(
            vf=robertson,
            t0=t0,
            h=h,
            y0=y0,
            k0=robertson(t0, y0, k),
            args=k,
            with_error=True,
            context=context,
        )
        step = solver.stages(given)
        first = FirstStepInput(
            vf=robertson, t0=t0, t1=t0 + h, y0=y0, k0=None, dt0=h, args=k, error_order=3, spec=None
        )
        _, state = controller.start(first)
        attempt = AttemptInput(
            t0=t0,
            t1=t0 + h,
            y0=y0,
            y1=step.y1,
            y_error=step.y_error,
            state=state,
            error_order=3,
            spec=None,
        )
        return step, controller.adapt(attempt)

    step, proposal = attempt()
    assert np.all(np.isposinf(step.y_error))
    assert np.all(np.isfinite(step.y1))
    assert not proposal.accept
    np.testing.assert_allclose(proposal.next_end, 0.2 * h)


def test_rejected_steps_never_reach_the_state():
    # Three chord iterations per stage: some steps fail and are rejected (10 of 60).
    sol = ode.diffeqsolve(
        ode.ODETerm(robertson),
        ode.Kvaerno3(max_iterations=3),
        0.0,
        1.0,
        0.5,
        jnp.array([1.0, 0.0, 0.0]),
        jnp.array(RATES),
        saveat=ode.SaveAt(steps=True),
        stepsize_controller=ode.PIDController(rtol=1e-6, atol=1e-8),
        max_steps=256,
    )
    ts, ys = np.asarray(sol.ts), np.asarray(sol.ys)
    assert int(sol.stats["num_rejected_steps"]) > 0
    assert np.all(np.isfinite(ys[np.isfinite(ts)]))
    y1 = ys[np.isfinite(ts)][-1]
    assert np.max(relative_errors(y1, robertson_reference(1.0))) < 1e-4


def test_failed_fixed_step_reports_nonlinear_divergence():
    """Without error control a failed step cannot be retried: the solve stops and says
    why (rather than silently continuing from an unconverged stage)."""
    sol = ode.diffeqsolve(
        ode.ODETerm(robertson),
        ode.Kvaerno5(max_iterations=1, max_refreshes=0),
        0.0,
        1.0,
        0.5,
        jnp.array([1.0, 0.0, 0.0]),
        jnp.array(RATES),
        throw=False,
    )
    assert sol.result == ode.RESULTS.nonlinear_divergence


# float64 for the first and the last solver, float32 for the first; every pair with
# `-m matrix` (Kvaerno3 and Kvaerno4 are stepped by the engine Kvaerno5 is).
@pytest.mark.parametrize(
    "entry, dtype",
    [(entry, jnp.float64) for entry in (IMPLICIT_SOLVERS[0], IMPLICIT_SOLVERS[-1])]
    + [
        pytest.param(entry, jnp.float64, marks=pytest.mark.matrix)
        for entry in IMPLICIT_SOLVERS[1:-1]
    ]
    + [(IMPLICIT_SOLVERS[0], jnp.float32)]
    + [
        pytest.param(entry, jnp.float32, marks=pytest.mark.matrix) for entry in IMPLICIT_SOLVERS[1:]
    ],
    ids=lambda x: solver_id(x) if isinstance(x, tuple) else jnp.dtype(x).name,
)
def test_fixed_steps_far_beyond_the_stiff_scale_converge(entry, dtype):
    """y' = -a (y - cos t), a = 1e5, at h = 0.1 and 0.25 (h a up to 25000): the stage
    value is a difference of terms ~h a |y|, known only to their rounding, which lies
    above the default fixed-step Newton tolerance of 100 ulp of y. The iterations must
    stop at that floor, not fail the step (which turned the solution into NaN)."""
    a = 1e5
    field = lambda t, y, args: -a * (y - jnp.cos(t))
    y0 = jnp.array([1.0, 2.0], dtype)
    exact = (a * a * np.cos(1.0) + a * np.sin(1.0)) / (a * a + 1)  # the transient is gone
    for dt0 in (0.1, 0.25):
        sol = ode.diffeqsolve(ode.ODETerm(field), entry[0], 0.0, 1.0, dt0, y0, throw=False)
        assert sol.result == ode.RESULTS.successful, (dt0, sol.result)
        assert sol.ys.dtype == dtype
        np.testing.assert_allclose(np.asarray(sol.ys[-1]), exact, rtol=3e-6)


def test_newton_tolerances_finer_than_the_dtype_resolves_converge():
    """ImplicitEuler on fixed steps in float32 with `optx.Newton(rtol=atol=1.4e-8)` (a
    float64 script's tolerances, below float32's resolution of the state): the iterations
    stop at the state's rounding instead of failing the step (they had reported a
    nonlinear divergence and NaN), and give the coarser tolerance's states."""
    optx = pytest.importorskip("optimistix")

    def field(t, y, args):
        x, v, theta, w = y
        u = jnp.clip(jnp.array([0.5, 0.2, -1.0, -0.3], y.dtype) @ y + args, -5.0, 5.0)
        swing = -9.81 * jnp.sin(theta) - 0.2 * w + u * jnp.cos(theta)
        return jnp.stack([v, u - 0.1 * v, w, swing])

    def solve(tolerance):
        solver = ode.ImplicitEuler(root_finder=optx.Newton(rtol=tolerance, atol=tolerance))
        y0 = jnp.array([0.0, 0.0, 0.3, 0.0], jnp.float32)
        return ode.diffeqsolve(ode.ODETerm(field), solver, 0.0, 1.0, 0.05, y0, 0.3, throw=False)

    fine, coarse = solve(1.4e-8), solve(1e-5)
    assert fine.result == ode.RESULTS.successful
    np.testing.assert_allclose(fine.ys, coarse.ys, rtol=1e-5, atol=1e-6)


def test_pytree_state_matches_flat_state():
    def split(t, y, k):
        flat = robertson(t, jnp.concatenate([y["fast"], y["slow"]]), k)
        return {"fast": flat[:2], "slow": flat[2:]}

    def solve(field, y0):
        return ode.diffeqsolve(
            ode.ODETerm(field),
            ode.Kvaerno5(),
            0.0,
            40.0,
            1e-4,
            y0,
            jnp.array(RATES),
            stepsize_controller=ROBERTSON_PID,
            max_steps=2048,
        )

    tree = solve(split, {"fast": jnp.array([1.0, 0.0]), "slow": jnp.array([0.0])})
    flat = _robertson_solve(ode.Kvaerno5(), jnp.asarray(40.0))
    got = jnp.concatenate([tree.ys["fast"][-1], tree.ys["slow"][-1]])
    np.testing.assert_allclose(got, flat.ys[-1], rtol=1e-12)
    assert int(tree.stats["num_steps"]) == int(flat.stats["num_steps"])


def _robertson_jacobian(t, y, k):
    return jnp.array(
        [
            [-k[0], k[2] * y[2], k[2] * y[1]],
            [k[0], -2 * k[1] * y[1] - k[2] * y[2], -k[2] * y[1]],
            [0.0, 2 * k[1] * y[1], 0.0],
        ]
    )


def test_user_jacobian_gives_the_same_solution():
    sol = ode.diffeqsolve(
        ode.ODETerm(robertson),
        ode.Kvaerno5(jacobian=_robertson_jacobian),
        0.0,
        40.0,
        1e-4,
        jnp.array([1.0, 0.0, 0.0]),
        jnp.array(RATES),
        stepsize_controller=ROBERTSON_PID,
        max_steps=2048,
    )
    np.testing.assert_allclose(
        sol.ys[-1], _robertson_solve(ode.Kvaerno5(), jnp.asarray(40.0)).ys[-1], rtol=1e-9
    )


def test_user_jacobian_needs_a_1d_state():
    with pytest.raises(ValueError, match="jacobian=.*1-D array"):
        ode.diffeqsolve(
            ode.ODETerm(lambda t, y, args: {"a": -y["a"]}),
            ode.Kvaerno5(jacobian=lambda t, y, args: -jnp.eye(1)),
            0.0,
            1.0,
            0.1,
            {"a": jnp.array([1.0])},
        )


def test_backwards_in_time_with_user_jacobian():
    """y' = 50 (y - cos t) is stiff when integrated backwards. Started on its particular
    solution (2500 cos t - 50 sin t) / 2501 at t = 1, it stays on it down to t = 0. The
    user's Jacobian is in t; the solver must map it to its internal time."""

    def field(t, y, args):
        return 50.0 * (y - jnp.cos(t))

    def exact(t):
        return (2500 * np.cos(t) - 50 * np.sin(t)) / 2501

    def solve(solver):
        sol = ode.diffeqsolve(ode.ODETerm(field), solver, 1.0, 0.0, -0.05, jnp.array([exact(1.0)]))
        return float(sol.ys[-1, 0])

    with_jacobian = solve(ode.Kvaerno5(jacobian=lambda t, y, args: 50.0 * jnp.eye(1)))
    assert abs(with_jacobian - exact(0.0)) < 1e-7


# ------------------------------------------------------------------------- gradients

# Fixed steps growing geometrically from 1e-4 through the initial transient.
GRAD_STEPS = ode.StepTo(np.concatenate([[0.0], np.geomspace(1e-4, 10.0, 41)]))


def _stiff_loss(k, adjoint):
    sol = ode.diffeqsolve(
        ode.ODETerm(robertson),
        ode.Kvaerno3(),
        0.0,
        10.0,
        None,
        jnp.array([1.0, 0.0, 0.0]),
        k,
        saveat=ode.SaveAt(ts=jnp.array([1.0, 5.0])),
        stepsize_controller=GRAD_STEPS,
        adjoint=adjoint,
        max_steps=256,
    )
    # y2 is ~1e-5: weight it up so every component matters.
    return jnp.sum(sol.ys * jnp.array([1.0, 1e4, 2.0]))


@pytest.mark.matrix  # every adjoint on a stiff solve: 13 s
def test_gradients_through_every_adjoint_agree():
    """Discretise-then-optimise gradients (fixed steps, no Newton configuration) agree
    across the default adjoint, DirectAdjoint, forward mode and central differences."""
    k = jnp.array(RATES)
    default = jax.jit(jax.grad(lambda k: _stiff_loss(k, ode.RecursiveCheckpointAdjoint())))(k)
    direct = jax.jit(jax.grad(lambda k: _stiff_loss(k, ode.DirectAdjoint())))(k)
    # Forward mode and the finite-difference evaluations in one compilation.
    steps = np.sqrt(EPS) * np.abs(np.asarray(RATES))
    shifts = np.concatenate([np.diag(steps), -np.diag(steps)])

    @jax.jit
    def forward_and_shifted(k):
        loss = lambda k: _stiff_loss(k, ode.ForwardMode())  # noqa: E731
        return jax.jacfwd(loss)(k), jax.vmap(loss)(k + shifts)

    forward, shifted = forward_and_shifted(k)
    fd = (shifted[:3] - shifted[3:]) / (2 * steps)
    np.testing.assert_allclose(direct, default, rtol=1e-10)
    np.testing.assert_allclose(forward, default, rtol=1e-10)
    np.testing.assert_allclose(default, fd, rtol=1e-5)


def _damped(t, y, p):
    """A linear system with eigenvalues about -p0 and -p1 (mildly stiff for p1 = 20)."""
    return jnp.stack([-p[0] * y[0] + y[1], -p[1] * y[1] + jnp.sin(t)])


def _damped_loss(p, adjoint):
    sol = ode.diffeqsolve(
        ode.ODETerm(_damped),
        ode.Kvaerno5(),
        0.0,
        1.0,
        0.01,
        jnp.array([1.0, 2.0]),
        p,
        saveat=ode.SaveAt(ts=jnp.array([0.5, 1.0])),
        stepsize_controller=ode.PIDController(rtol=1e-8, atol=1e-8),
        adjoint=adjoint,
        max_steps=4096,
    )
    return jnp.sum(sol.ys * jnp.array([1.0, 3.0]))


@pytest.mark.matrix  # every adjoint on the stiff problem stays in the suite
def test_backsolve_gradient_agrees_with_discrete_gradient():
    """BacksolveAdjoint re-solves the state backwards, which is unstable for a truly stiff
    problem (its fast modes grow backwards), so this one is only mildly stiff. The
    continuous adjoint agrees with the discrete gradient to the solver's tolerance."""
    p = jnp.array([1.0, 20.0])
    backsolve = jax.jit(jax.grad(lambda p: _damped_loss(p, ode.BacksolveAdjoint())))(p)
    default = jax.jit(jax.grad(lambda p: _damped_loss(p, ode.RecursiveCheckpointAdjoint())))(p)
    np.testing.assert_allclose(backsolve, default, rtol=1e-4)


@pytest.mark.parametrize("solver,dense_order", [(ode.Kvaerno4(), 3), (ode.Kvaerno5(), 4)])
def test_dense_output_is_a_continuous_extension(solver, dense_order):
    """Between steps, y(theta) = y0 + h sum_i b_i(theta) k_i has the claimed order at every
    theta (the elementary weights of every tree of that order), starts with the slope
    f(t0, y0), and reaches y1 at theta = 1."""
    from odesolve._solver._continuous_extension import (
        _density,
        _elementary_weights,
        rooted_trees,
    )

    tab = solver.tableau
    s = tab.num_stages
    a = np.zeros((s, s))
    for i, row in enumerate(tab.a):
        a[i + 1, : i + 1] = row
        a[i + 1, i + 1] = tab.gamma
    interp = np.asarray(tab.interp)
    powers = np.arange(1, interp.shape[1] + 1)
    np.testing.assert_allclose(interp.sum(axis=1), tab.b, atol=1e-12)
    np.testing.assert_allclose(interp[:, 0], np.eye(s)[0], atol=1e-12)
    for theta in (0.2, 0.5, 0.9):
        weights = interp @ theta**powers
        for r in range(1, dense_order + 1):
            for tree in rooted_trees(r):
                residual = weights @ _elementary_weights(tree, a) - theta**r / _density(tree)
                assert abs(residual) < 1e-12, (theta, tree, residual)


def _robertson_loss(k, y0, adjoint=ode.RecursiveCheckpointAdjoint()):
    # rtol 1e-3: steps that the Newton iterations reject (2 of 17) are taken too.
    sol = ode.diffeqsolve(
        ode.ODETerm(robertson), ode.Kvaerno5(), 0.0, 100.0, None, y0, k,
        saveat=ode.SaveAt(ts=jnp.array([1.0, 100.0])),
        stepsize_controller=ode.PIDController(rtol=1e-3, atol=1e-6),
        adjoint=adjoint, max_steps=512,
    )  # fmt: skip
    return jnp.sum(sol.ys * jnp.array([1.0, 1e4, 2.0]))


@pytest.mark.matrix  # seven transformations of an adaptive stiff solve: about a minute
def test_adaptive_stiff_gradients_in_every_transformation_order():
    """grad, vmap(grad) with batched and shared parameters, grad(vmap), jacrev(vmap),
    jit(jvp) and vmap(vmap(grad)) against forward mode one sample at a time."""
    k = jnp.array(RATES)
    ks = k * jnp.array([[1.0, 1.0, 1.0], [1.1, 0.9, 1.2]])
    y0s = jnp.array([[1.0, 0.0, 0.0], [0.9, 0.0, 0.1]])
    forward = ode.ForwardMode()
    one = lambda q, y0: jax.jacfwd(lambda q: _robertson_loss(q, y0, forward))(q)  # noqa: E731
    batched = np.stack([one(ks[i], y0s[i]) for i in range(2)])
    shared = np.stack([one(k, y0s[i]) for i in range(2)])
    grad = jax.grad(_robertson_loss)
    summed = lambda q: jnp.sum(jax.vmap(_robertson_loss, in_axes=(None, 0))(q, y0s))  # noqa: E731
    direct = lambda q: _robertson_loss(q, y0s[1], ode.DirectAdjoint())  # noqa: E731
    tangent = jnp.array([1.0, 0.0, 0.0])
    cases = {
        "grad": (jax.jit(grad)(k, y0s[0]), shared[0]),
        "vmap(grad) batched": (jax.vmap(grad)(ks, y0s), batched),
        "vmap(grad) shared": (jax.vmap(grad, in_axes=(None, 0))(k, y0s), shared),
        "grad(vmap)": (jax.grad(summed)(k), shared.sum(0)),
        "jacrev(vmap)": (
            jax.jacrev(lambda q: jax.vmap(_robertson_loss, in_axes=(None, 0))(q, y0s))(k),
            shared,
        ),
        "jit(jvp)": (jax.jit(lambda q: jax.jvp(direct, (q,), (tangent,))[1])(k), shared[1, 0]),
        "vmap(vmap(grad))": (
            jax.vmap(jax.vmap(grad))(jnp.stack([ks, ks]), jnp.stack([y0s, y0s])),
            np.stack([batched, batched]),
        ),
    }
    for name, (actual, expected) in cases.items():
        np.testing.assert_allclose(actual, expected, rtol=1e-12, err_msg=name)
    # The discrete gradient is the solution's to the tolerance: central differences.
    h = 1e-4 * RATES[0]
    loss = lambda q: _robertson_loss(q, y0s[0])  # noqa: E731
    fd = (loss(k.at[0].add(h)) - loss(k.at[0].add(-h))) / (2 * h)
    np.testing.assert_allclose(shared[0, 0], fd, rtol=1e-3)
