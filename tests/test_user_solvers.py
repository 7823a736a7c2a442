"""Solvers written in Diffrax's interface (`init`, `step`, `func`, `interpolation_cls`)
run in `diffeqsolve` under every controller, output and adjoint, and agree with Diffrax
running the same class. Each solver is written once, for either library (`lib`)."""

import diffrax
import jax
import jax.lax as lax
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode


def crank_nicolson(lib):
    """Diffrax's nonlinear heat PDE example's solver: implicit trapezoidal steps by
    fixed-point iteration, the explicit Euler step's difference as the error."""

    class CrankNicolson(lib.AbstractSolver):
        rtol: float
        atol: float

        term_structure = lib.ODETerm
        interpolation_cls = lib.LocalLinearInterpolation

        def order(self, terms):
            return 2

        def init(self, terms, t0, t1, y0, args):
            return None

        def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
            del solver_state, made_jump
            dt = t1 - t0
            f0 = terms.vf(t0, y0, args)

            def not_converged(val):
                return val[1]

            def iterate(val):
                y1, _ = val
                new_y1 = y0 + 0.5 * dt * (f0 + terms.vf(t1, y1, args))
                scale = self.atol + self.rtol * jnp.maximum(jnp.abs(y1), jnp.abs(new_y1))
                return new_y1, jnp.any(jnp.abs(new_y1 - y1) > scale)

            euler_y1 = y0 + dt * f0
            y1, _ = lax.while_loop(not_converged, iterate, (euler_y1, jnp.asarray(True)))
            dense_info = dict(y0=y0, y1=y1)
            return y1, y1 - euler_y1, dense_info, None, lib.RESULTS.successful

        def func(self, terms, t0, y0, args):
            return terms.vf(t0, y0, args)

    return CrankNicolson


def heun(lib, interpolation="LocalLinearInterpolation"):
    """Heun's method with embedded Euler on any PyTree state; its dense output is
    linear, cubic Hermite (the step's end slopes) or quartic (through a midpoint made of
    the stages, `c_mid`)."""
    tree = jax.tree_util.tree_map
    dense_output = getattr(lib, interpolation)
    if interpolation.startswith("FourthOrder"):
        dense_output = type("Quartic", (dense_output,), {"c_mid": np.array([0.25, 0.25, 0.0])})

    class Heun(lib.AbstractAdaptiveSolver):
        term_structure = lib.ODETerm
        interpolation_cls = dense_output

        def order(self, terms):
            return 2

        def init(self, terms, t0, t1, y0, args):
            return None

        def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
            dt = t1 - t0
            f0 = terms.vf(t0, y0, args)
            euler = tree(lambda y, f: y + dt * f, y0, f0)
            f1 = terms.vf(t1, euler, args)
            y1 = tree(lambda y, a, b: y + 0.5 * dt * (a + b), y0, f0, f1)
            dense_info = dict(y0=y0, y1=y1)
            ends = tree(lambda f: dt * f, terms.vf(t1, y1, args))
            if interpolation.startswith("ThirdOrder"):
                dense_info.update(k0=tree(lambda f: dt * f, f0), k1=ends)
            if interpolation.startswith("FourthOrder"):
                stages = (tree(lambda f: dt * f, f0), tree(lambda f: dt * f, f1), ends)
                dense_info.update(k=tree(lambda *k: jnp.stack(k), *stages))
            error = tree(lambda a, b: a - b, y1, euler)
            return y1, error, dense_info, None, lib.RESULTS.successful

        def func(self, terms, t0, y0, args):
            return terms.vf(t0, y0, args)

    return Heun


def _heat(t, y, args):
    # u_t = (1 - u) u_xx on a grid of 12 points, Dirichlet ends (the example's PDE).
    dx = 2.0 / (y.shape[0] - 1)
    lap = (jnp.roll(y, 1) - 2 * y + jnp.roll(y, -1)) / dx**2
    return (1 - y) * lap.at[0].set(0.0).at[-1].set(0.0)


def _forced(t, y, args):
    return {"x": -args * y["x"] + jnp.sin(t), "v": jnp.sum(y["x"]) - y["v"]}


_Y0 = {"x": jnp.array([1.0, 2.0]), "v": jnp.array(0.5)}


def _solve(lib, solver, field, y0, controller, saveat, args=None, t1=1.0, **kwargs):
    return lib.diffeqsolve(
        lib.ODETerm(field), solver, 0.0, t1, 0.01 * t1, y0, args,
        saveat=saveat, stepsize_controller=controller, **kwargs,
    )  # fmt: skip


def _close(a, b, tol):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=tol, atol=tol)


@pytest.mark.parametrize("adaptive", [False, True])
def test_crank_nicolson_of_the_heat_example_agrees_with_diffrax(adaptive):
    y0 = jnp.linspace(-1.0, 1.0, 12) ** 2
    ts = jnp.linspace(0.0, 0.2, 5)
    out = {}
    for lib in (ode, diffrax):
        controller = (
            lib.PIDController(rtol=1e-6, atol=1e-6, pcoeff=0.3, icoeff=0.4, dtmax=0.01)
            if adaptive
            else lib.ConstantStepSize()
        )
        sol = _solve(
            lib, crank_nicolson(lib)(1e-10, 1e-10), _heat, y0, controller,
            lib.SaveAt(ts=ts), t1=0.2,
        )  # fmt: skip
        out[lib] = sol.ys, sol.stats["num_steps"]
    _close(out[ode][0], out[diffrax][0], 1e-12)
    assert int(out[ode][1]) == int(out[diffrax][1])


@pytest.mark.parametrize(
    "interpolation",
    [
        "LocalLinearInterpolation",
        pytest.param("ThirdOrderHermitePolynomialInterpolation", marks=pytest.mark.matrix),
        pytest.param("FourthOrderPolynomialInterpolation", marks=pytest.mark.matrix),
    ],
)
def test_adaptive_user_solver_saves_as_diffrax(interpolation):
    ts = jnp.linspace(0.0, 3.0, 7)
    query = jnp.array([0.33, 1.77, 2.9])
    sols = {}
    for lib in (ode, diffrax):
        subs = [lib.SubSaveAt(ts=ts), lib.SubSaveAt(steps=True)]
        saveat = lib.SaveAt(subs=subs, dense=True)
        controller = lib.PIDController(rtol=1e-5, atol=1e-7)
        solver = heun(lib, interpolation)()
        sols[lib] = _solve(lib, solver, _forced, _Y0, controller, saveat, 0.7, 3.0)
    ours, theirs = sols[ode], sols[diffrax]
    n = int(theirs.stats["num_accepted_steps"])
    assert int(ours.stats["num_steps"]) == int(theirs.stats["num_steps"])
    assert int(ours.stats["num_accepted_steps"]) == n
    _close(ours.ts[0], theirs.ts[0], 1e-12)
    _close(ours.ys[0], theirs.ys[0], 1e-12)
    _close(ours.ts[1][:n], theirs.ts[1][:n], 1e-12)
    _close(jax.tree_util.tree_map(lambda y: y[:n], ours.ys[1]),
           jax.tree_util.tree_map(lambda y: y[:n], theirs.ys[1]), 1e-12)  # fmt: skip
    _close(jax.vmap(ours.evaluate)(query), jax.vmap(theirs.evaluate)(query), 1e-12)
    _close(jax.vmap(ours.derivative)(query), jax.vmap(theirs.derivative)(query), 1e-10)


def test_user_solver_backwards_in_time_and_under_jit_and_vmap():
    # The step is given real times (t1 < t0), so a step written with t1 - t0 goes
    # backwards correctly. Diffrax hands it internal times, where only `terms.contr`
    # is right: its reference is the mirrored problem s = -t solved forwards.
    ts = jnp.linspace(2.0, 0.0, 5)
    mirrored = lambda s, y, a: jax.tree_util.tree_map(jnp.negative, _forced(-s, y, a))

    def solve(lib, field, t0, t1, dt0, save, a):
        sol = lib.diffeqsolve(
            lib.ODETerm(field), heun(lib)(), t0, t1, dt0, _Y0, a,
            saveat=lib.SaveAt(ts=save), stepsize_controller=lib.PIDController(rtol=1e-6, atol=1e-8),
        )  # fmt: skip
        return sol.ys, sol.stats["num_steps"]

    backwards = lambda a: solve(ode, _forced, 2.0, 0.0, -0.05, ts, a)
    ours, steps = jax.jit(jax.vmap(backwards))(jnp.array([0.5, 0.9]))
    for i, a in enumerate(jnp.array([0.5, 0.9])):
        ref, ref_steps = solve(diffrax, mirrored, -2.0, 0.0, 0.05, -ts, a)
        _close(jax.tree_util.tree_map(lambda y: y[i], ours), ref, 1e-11)
        assert int(steps[i]) == int(ref_steps)


def _loss(lib, solver, adjoint, a):
    ts = jnp.linspace(0.0, 2.0, 5)
    sol = _solve(
        lib, solver, _forced, _Y0, lib.PIDController(rtol=1e-7, atol=1e-7),
        lib.SaveAt(ts=ts), a, 2.0, adjoint=adjoint,
    )  # fmt: skip
    return sum(jnp.sum(y**2) for y in jax.tree_util.tree_leaves(sol.ys))


@pytest.mark.parametrize(
    "adjoint",
    [
        pytest.param(ode.RecursiveCheckpointAdjoint(), id="recursive"),
        pytest.param(ode.DirectAdjoint(), id="direct", marks=pytest.mark.matrix),
        # BacksolveAdjoint's backward solve runs in the suite in test_composition.py.
        pytest.param(ode.BacksolveAdjoint(), id="backsolve", marks=pytest.mark.matrix),
    ],
)
def test_user_solver_gradients_match_finite_differences(adjoint):
    a, eps = jnp.asarray(0.7), 1e-6
    grad = jax.grad(lambda a: _loss(ode, heun(ode)(), adjoint, a))(a)
    value = lambda a: float(_loss(ode, heun(ode)(), ode.RecursiveCheckpointAdjoint(), a))
    fd = (value(a + eps) - value(a - eps)) / (2 * eps)
    # Differences also see the step sizes move with `a` (by about the tolerance, 1e-7);
    # the continuous adjoint is exact only as its own solve's tolerance allows.
    tol = 1e-4 if isinstance(adjoint, ode.BacksolveAdjoint) else 2e-5
    np.testing.assert_allclose(float(grad), fd, rtol=tol)


@pytest.mark.matrix
def test_user_solver_gradient_equals_diffrax():
    a = jnp.asarray(0.7)
    ours = jax.grad(lambda a: _loss(ode, heun(ode)(), ode.RecursiveCheckpointAdjoint(), a))(a)
    adjoint = diffrax.RecursiveCheckpointAdjoint()
    theirs = jax.grad(lambda a: _loss(diffrax, heun(diffrax)(), adjoint, a))(a)
    np.testing.assert_allclose(float(ours), float(theirs), rtol=1e-10)


def test_user_solver_forward_mode_equals_reverse_mode():
    solver = heun(ode)()
    a = jnp.asarray(0.7)
    saveat = ode.SaveAt(t1=True)

    def fixed(a, adjoint):
        sol = _solve(ode, solver, _forced, _Y0, ode.ConstantStepSize(), saveat, a, adjoint=adjoint)
        return sol.ys["v"][0]

    tangent = jax.jvp(lambda a: fixed(a, ode.ForwardMode()), (a,), (1.0,))[1]
    gradient = jax.grad(lambda a: fixed(a, ode.DirectAdjoint()))(a)
    np.testing.assert_allclose(float(tangent), float(gradient), rtol=1e-10)


@pytest.mark.matrix
def test_half_solver_wraps_a_user_solver():
    sol = _solve(ode, ode.HalfSolver(crank_nicolson(ode)(1e-12, 1e-12)), _heat,
                 jnp.linspace(-1.0, 1.0, 8) ** 2, ode.PIDController(rtol=1e-6, atol=1e-6),
                 ode.SaveAt(t1=True), t1=0.1)  # fmt: skip
    ref = _solve(diffrax, diffrax.HalfSolver(crank_nicolson(diffrax)(1e-12, 1e-12)), _heat,
                 jnp.linspace(-1.0, 1.0, 8) ** 2, diffrax.PIDController(rtol=1e-6, atol=1e-6),
                 diffrax.SaveAt(t1=True), t1=0.1)  # fmt: skip
    _close(sol.ys, ref.ys, 1e-12)


def test_user_solver_kinds_and_what_it_must_define():
    cn = crank_nicolson(ode)(1e-8, 1e-8)
    assert isinstance(cn, ode.AbstractSolver)
    assert not isinstance(cn, ode.AbstractAdaptiveSolver)
    assert isinstance(heun(ode)(), ode.AbstractAdaptiveSolver)
    assert isinstance(ode.Tsit5(), ode.AbstractAdaptiveSolver)
    assert not isinstance(ode.Euler(), ode.AbstractAdaptiveSolver)
    assert isinstance(ode.Kvaerno3(), ode.AbstractImplicitSolver)
    assert not isinstance(ode.Tsit5(), ode.AbstractImplicitSolver)

    class NoInit(ode.AbstractSolver):
        term_structure = ode.ODETerm
        interpolation_cls = ode.LocalLinearInterpolation

        def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
            return y0, None, dict(y0=y0, y1=y0), None, ode.RESULTS.successful

    with pytest.raises(TypeError, match="init"):
        NoInit()


def test_a_step_written_over_a_final_solver_inherits_its_init_and_func():
    # As a user package writes it (`class Stepper(diffrax.Euler)` with its own `step`).
    def stepper(lib):
        class Stepper(lib.Euler):
            def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
                half = y0 + 0.5 * (t1 - t0) * terms.vf(t0, y0, args)
                y1 = y0 + (t1 - t0) * terms.vf(0.5 * (t0 + t1), half, args)
                return y1, None, dict(y0=y0, y1=y1), solver_state, lib.RESULTS.successful

        return Stepper()

    field = lambda t, y, args: -args * y + jnp.sin(t)
    y0 = jnp.array([1.0, -0.5])
    saveat = lambda lib: lib.SaveAt(ts=jnp.linspace(0.0, 1.0, 7))
    solve = lambda lib: _solve(
        lib, stepper(lib), field, y0, lib.ConstantStepSize(), saveat(lib), 0.8
    )
    ours, theirs = solve(ode), solve(diffrax)
    _close(ours.ys, theirs.ys, 1e-12)
    solver = stepper(ode)
    state = solver.init(ode.ODETerm(field), 0.0, 0.1, y0, 0.8)
    _close(solver.func(ode.ODETerm(field), 0.0, y0, 0.8), field(0.0, y0, 0.8), 0.0)
    y1 = solver.step(ode.ODETerm(field), 0.0, 0.1, y0, 0.8, state, False)[0]
    assert not np.allclose(y1, y0 + 0.1 * field(0.0, y0, 0.8))  # its own step, not Euler's


class _ImplicitEuler(ode.AbstractImplicitSolver):
    # Backward Euler by fixed-point iteration, declared implicit as Diffrax asks.
    root_finder: None = None
    root_find_max_steps: int = 50

    term_structure = ode.ODETerm
    interpolation_cls = ode.LocalLinearInterpolation

    def order(self, terms):
        return 1

    def init(self, terms, t0, t1, y0, args):
        return None

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        iterate = lambda _, y1: y0 + (t1 - t0) * terms.vf(t1, y1, args)
        y1 = lax.fori_loop(0, self.root_find_max_steps, iterate, y0)
        return y1, None, dict(y0=y0, y1=y1), None, ode.RESULTS.successful

    def func(self, terms, t0, y0, args):
        return terms.vf(t0, y0, args)


def test_implicit_user_solver_and_a_step_without_an_error_estimate():
    solver = _ImplicitEuler()
    assert isinstance(solver, ode.AbstractImplicitSolver)
    sol = ode.diffeqsolve(ode.ODETerm(lambda t, y, a: -y), solver, 0.0, 1.0, 0.1, jnp.array(1.0))
    np.testing.assert_allclose(float(sol.ys[0]), 1.1**-10, rtol=1e-12)
    with pytest.raises(ValueError, match="y_error=None.*ConstantStepSize"):
        ode.diffeqsolve(
            ode.ODETerm(lambda t, y, a: -y), solver, 0.0, 1.0, 0.1, jnp.array(1.0),
            stepsize_controller=ode.PIDController(rtol=1e-6, atol=1e-6),
        )  # fmt: skip


def test_user_solver_without_an_interpolation_or_of_several_terms_is_refused_with_the_fix():
    base = type(heun(ode)())
    bare = type("Bare", (base,), {"interpolation_cls": None})()
    with pytest.raises(TypeError, match="interpolation_cls = LocalLinearInterpolation"):
        ode.diffeqsolve(ode.ODETerm(_forced), bare, 0.0, 1.0, 0.1, _Y0, 0.7)
    pair = ode.MultiTerm[tuple[ode.ODETerm, ode.ODETerm]]
    imex = type("Imex", (base,), {"term_structure": pair})()
    with pytest.raises(TypeError, match="term_structure.*set term_structure = ODETerm"):
        ode.diffeqsolve(ode.ODETerm(_forced), imex, 0.0, 1.0, 0.1, _Y0, 0.7)


def test_a_user_solver_may_be_of_both_kinds():
    class AdaptiveImplicitEuler(_ImplicitEuler, ode.AbstractAdaptiveSolver):
        pass

    solver = AdaptiveImplicitEuler()
    assert isinstance(solver, ode.AbstractImplicitSolver)
    assert isinstance(solver, ode.AbstractAdaptiveSolver)


def own_term_solvers(lib):
    """Two solvers that step with a term of their own rather than an ODE's field, for
    either library: `Decay` keeps a placeholder term whose `vf` returns None (implicit
    Euler for y' = -k y, k in `args`, as a solver that reads its problem from `args`
    does); `MagnusEuler` takes the exponential (Cayley's, of order 2) of its term's `vf`,
    a matrix generator (a rotation scaled by the term's own array `a`, plus `args * t`),
    its error against Euler's."""

    class Placeholder(lib.AbstractTerm):
        def vf(self, t, y, args):
            return None

        def contr(self, t0, t1):
            return t1 - t0

        def prod(self, vf, control):
            return None

    class Stateless(lib.AbstractSolver):
        interpolation_cls = lib.LocalLinearInterpolation

        def init(self, terms, t0, t1, y0, args):
            return None

    class Decay(Stateless):
        term_structure = Placeholder

        def order(self, terms):
            return 1

        def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
            y1 = y0 / (1 + args * (t1 - t0))
            return y1, None, dict(y0=y0, y1=y1), None, lib.RESULTS.successful

        def func(self, terms, t0, y0, args):
            return None

    class Generator(lib.AbstractTerm):
        a: jax.Array

        def vf(self, t, y, args):
            return self.a * jnp.array([[0.0, 1.0], [-1.0, 0.0]]) + args * t * jnp.eye(2)

        def contr(self, t0, t1):
            return t1 - t0

        def prod(self, vf, control):
            return vf * control

    class MagnusEuler(Stateless):
        term_structure = Generator

        def order(self, terms):
            return 2

        def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
            control = terms.contr(t0, t1)
            generator = terms.vf(0.5 * (t0 + t1), y0, args)
            half = 0.5 * terms.prod(generator, control)  # Cayley: exp(G dt) to order 2
            y1 = jnp.linalg.solve(jnp.eye(2) - half, y0 + half @ y0)
            euler = y0 + terms.prod(terms.vf(t0, y0, args), control) @ y0
            return y1, y1 - euler, dict(y0=y0, y1=y1), None, lib.RESULTS.successful

        def func(self, terms, t0, y0, args):
            return terms.vf(t0, y0, args) @ y0

    return (Placeholder, Decay), (Generator, MagnusEuler)


def _own_term_solve(lib, which, a, c, t1=2.0, **kwargs):
    term, solver = own_term_solvers(lib)[which]
    terms = term() if which == 0 else term(a)
    ts = jnp.linspace(0.0, t1, 4)
    kwargs = dict(dict(dt0=0.1 if t1 > 0 else -0.1, saveat=lib.SaveAt(ts=ts)), **kwargs)
    y0 = jnp.array([1.0, 0.5])
    return lib.diffeqsolve(terms, solver(), 0.0, t1, y0=y0, args=c, **kwargs)


def _own_term_gradient(lib, which):
    loss = lambda a, c: jnp.sum(_own_term_solve(lib, which, a, c).ys ** 2)
    return jax.value_and_grad(loss, argnums=(0, 1))(1.3, 0.4)


def _own_term_by_hand(which, a, c):
    """`_own_term_solve`'s save times written out: the solver's own `step` over the 20
    steps of 0.1, then its linear interpolation at the save times."""
    term, solver = own_term_solvers(ode)[which]
    terms, step = (term() if which == 0 else term(a)), solver().step
    y0 = jnp.array([1.0, 0.5])

    def one(y, n):
        y = step(terms, 0.1 * n, 0.1 * (n + 1), y, c, None, False)[0]
        return y, y

    grid = jnp.linspace(0.0, 2.0, 21)
    ys = jnp.concatenate([y0[None], lax.scan(one, y0, jnp.arange(20.0))[1]])
    ts = jnp.linspace(0.0, 2.0, 4)
    return jnp.stack([jnp.interp(ts, grid, ys[:, i]) for i in range(2)], axis=1)


def test_a_user_solver_steps_with_its_own_terms_as_diffrax():
    """Diffrax hands a solver the terms it was given; a term whose `vf` is no ODE's
    (a placeholder returning None, a matrix generator) reaches the solver as it is,
    and its arrays receive gradients: against the solver's steps taken by hand (and
    Diffrax, under -m matrix). Backwards, the step is given real times, as any user
    solver's (see above): `Decay`, whose step reads t1 - t0 itself, takes 20 steps of
    implicit Euler of size -0.1 (Diffrax's would step forwards in internal time)."""
    for which in (0, 1):
        by_hand = lambda a, c, which=which: jnp.sum(_own_term_by_hand(which, a, c) ** 2)
        expected = jax.jit(jax.value_and_grad(by_hand, argnums=(0, 1)))(1.3, 0.4)
        _close(_own_term_gradient(ode, which), expected, 1e-12)
    backwards = _own_term_solve(ode, 0, None, 0.4, -2.0).ys[-1]
    _close(backwards, jnp.array([1.0, 0.5]) / (1 - 0.04) ** 20, 1e-12)


@pytest.mark.matrix
def test_own_terms_backwards_batched_and_in_forward_mode():
    """The generator's solve backwards against Diffrax (its step goes through the term,
    so internal and real times agree), per-sample gradients of the term's own array
    under `jit(vmap(grad))`, and forward mode against reverse mode; forwards, both
    solvers' gradients against Diffrax's."""
    for which in (0, 1):
        _close(_own_term_gradient(ode, which), _own_term_gradient(diffrax, which), 1e-12)
    loss = lambda lib, a, t1=2.0: jnp.sum(_own_term_solve(lib, 1, a, 0.4, t1).ys ** 2)
    backwards = lambda lib: jax.value_and_grad(lambda a: loss(lib, a, -2.0))(1.3)
    _close(backwards(ode), backwards(diffrax), 1e-12)
    batch = jnp.array([0.9, 1.3])
    per_sample = lambda lib: jax.jit(jax.vmap(jax.grad(lambda a: loss(lib, a))))(batch)
    _close(per_sample(ode), per_sample(diffrax), 1e-12)
    fixed = lambda a, adjoint: jnp.sum(_own_term_solve(ode, 1, a, 0.4, adjoint=adjoint).ys)
    tangent = jax.jvp(lambda a: fixed(a, ode.ForwardMode()), (1.3,), (1.0,))[1]
    gradient = jax.grad(lambda a: fixed(a, ode.RecursiveCheckpointAdjoint()))(1.3)
    np.testing.assert_allclose(float(tangent), float(gradient), rtol=1e-10)


def test_a_solver_with_terms_of_its_own_and_what_needs_a_field_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"dt0=None.*Decay.func.*returned None.*Pass dt0"):
        _own_term_solve(ode, 0, None, 0.4, dt0=None)
    with pytest.raises(ode.UnsupportedCombination, match="BacksolveAdjoint.*RecursiveCheck"):
        _own_term_solve(ode, 0, None, 0.4, adjoint=ode.BacksolveAdjoint())
    # A `func` that returns dy/dt picks the first step as Diffrax's does.
    pid = lambda lib: dict(dt0=None, stepsize_controller=lib.PIDController(rtol=1e-3, atol=1e-6))
    ours = _own_term_solve(ode, 1, 1.3, 0.4, **pid(ode))
    theirs = _own_term_solve(diffrax, 1, 1.3, 0.4, **pid(diffrax))
    assert int(ours.stats["num_steps"]) > 0
    _close(ours.ys, theirs.ys, 1e-2)
