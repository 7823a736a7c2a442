"""Solvers that carry more than the state (ReversibleHeun, LeapfrogMidpoint), HalfSolver,
Diffrax's low-level solver API, and `SaveAt(subs=...)`.

References: Diffrax (the same methods, fixed steps: equal to rounding), the exact
solution exp(sin t) of y' = y cos t (orders), forward mode and central differences
(gradients), and separate solves (each `SubSaveAt`).
"""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode


def field(t, y, args):
    return y * jnp.cos(t) * args


def solve(solver, dt, rate=1.0, t1=4.0, **kwargs):
    return ode.diffeqsolve(
        ode.ODETerm(field), solver, 0.0, t1, dt, jnp.asarray([1.0, 0.5]), rate, **kwargs
    )


NEW = {
    "ReversibleHeun": (ode.ReversibleHeun(), diffrax.ReversibleHeun(), 2),
    "LeapfrogMidpoint": (ode.LeapfrogMidpoint(), diffrax.LeapfrogMidpoint(), 2),
    "HalfSolver(Euler)": (ode.HalfSolver(ode.Euler()), diffrax.HalfSolver(diffrax.Euler()), 1),
    "HalfSolver(Heun)": (ode.HalfSolver(ode.Heun()), diffrax.HalfSolver(diffrax.Heun()), 2),
}


@pytest.mark.parametrize(
    "name",
    # A HalfSolver steps as the method it wraps: its fixed steps with -m matrix.
    [pytest.param(n, marks=pytest.mark.matrix) if "Half" in n else n for n in NEW],
)
def test_fixed_steps_equal_diffrax_and_converge_at_the_order(name):
    ours, theirs, order = NEW[name]
    errors = []
    dts = [1 / 16, 1 / 32, 1 / 64]
    for dt in dts:
        sol = solve(ours, dt, saveat=ode.SaveAt(ts=jnp.linspace(0.0, 4.0, 9)))
        ref = diffrax.diffeqsolve(
            diffrax.ODETerm(field), theirs, 0.0, 4.0, dt, jnp.asarray([1.0, 0.5]), 1.0,
            saveat=diffrax.SaveAt(ts=jnp.linspace(0.0, 4.0, 9)),
        )  # fmt: skip
        np.testing.assert_allclose(sol.ys, ref.ys, rtol=1e-11, atol=1e-12)
        errors.append(np.max(np.abs(sol.ys[-1] - np.exp(np.sin(4.0)) * np.array([1.0, 0.5]))))
    slope = np.polyfit(np.log(dts), np.log(errors), 1)[0]
    assert slope == pytest.approx(order, abs=0.25), errors


@pytest.mark.parametrize(
    "name",
    [
        "ReversibleHeun",
        "HalfSolver(Euler)",
        pytest.param("HalfSolver(Heun)", marks=pytest.mark.matrix),
    ],
)
def test_adaptive_steps_reach_the_tolerance(name):
    ours, _, _ = NEW[name]
    sol = solve(ours, 0.01, stepsize_controller=ode.PIDController(rtol=1e-6, atol=1e-6))
    exact = np.exp(np.sin(4.0)) * np.array([1.0, 0.5])
    assert np.max(np.abs(sol.ys[-1] - exact)) < 1e-3
    assert int(sol.stats["num_steps"]) < 4000


def test_half_steps_of_a_method_with_a_stage_at_the_end_take_diffraxs_steps():
    # Tsit5's last stage is at the end of each half step (c = 1), which is the middle of
    # the whole step for the first half, not the whole step's end.
    pid = lambda lib: lib.PIDController(rtol=1e-8, atol=1e-8)
    sol = solve(ode.HalfSolver(ode.Tsit5()), 0.01, stepsize_controller=pid(ode))
    ref = diffrax.diffeqsolve(
        diffrax.ODETerm(field), diffrax.HalfSolver(diffrax.Tsit5()), 0.0, 4.0, 0.01,
        jnp.asarray([1.0, 0.5]), 1.0, stepsize_controller=pid(diffrax),
    )  # fmt: skip
    assert int(sol.stats["num_steps"]) == int(ref.stats["num_steps"])
    np.testing.assert_allclose(sol.ys, ref.ys, rtol=1e-12)


def test_a_method_without_an_error_estimate_suggests_halfsolver():
    with pytest.raises(ValueError, match="HalfSolver"):
        solve(ode.LeapfrogMidpoint(), 0.1, stepsize_controller=ode.PIDController(1e-6, 1e-6))


# Covered in CI by `test_every_transformation_order` (ReversibleHeun); here also against
# central differences, before a release.
@pytest.mark.matrix
@pytest.mark.parametrize("name", ["ReversibleHeun", "LeapfrogMidpoint", "HalfSolver(Heun)"])
def test_gradients_match_forward_mode_and_differences(name):
    ours, _, _ = NEW[name]
    controller = ode.ConstantStepSize()
    if ours.adaptive:
        controller = ode.PIDController(rtol=1e-5, atol=1e-5)

    def loss(rate, adjoint=ode.RecursiveCheckpointAdjoint()):
        sol = solve(ours, 0.05, rate, stepsize_controller=controller, adjoint=adjoint,
                    saveat=ode.SaveAt(ts=jnp.array([1.0, 2.5, 4.0])))  # fmt: skip
        return jnp.sum(sol.ys**2)

    rate = jnp.asarray(0.8)
    reverse = jax.grad(loss)(rate)
    forward = jax.jacfwd(lambda r: loss(r, ode.ForwardMode()))(rate)
    np.testing.assert_allclose(reverse, forward, rtol=1e-9)
    if not ours.adaptive:  # step choices move with the rate: differences see those too
        eps = 1e-6
        central = (loss(rate + eps) - loss(rate - eps)) / (2 * eps)
        np.testing.assert_allclose(reverse, central, rtol=1e-6)
    rates = jnp.array([0.5, 0.8, 1.1])
    per_sample = jax.vmap(jax.grad(loss))(rates)
    one_by_one = jnp.stack([jax.grad(loss)(r) for r in rates])
    np.testing.assert_allclose(per_sample, one_by_one, rtol=1e-9)


# ------------------------------------------------------------ Diffrax's low-level API


@pytest.mark.parametrize(
    "pair",
    [
        (ode.Tsit5(), diffrax.Tsit5()),
        (ode.ReversibleHeun(), diffrax.ReversibleHeun()),
        (ode.LeapfrogMidpoint(), diffrax.LeapfrogMidpoint()),
    ],
    ids=lambda p: type(p).__name__,
)
def test_init_step_func_as_diffrax(pair):
    ours, theirs = pair
    y0 = {"a": jnp.asarray([1.0, 0.5]), "b": jnp.asarray(2.0)}
    vf = lambda t, y, args: jax.tree_util.tree_map(lambda x: -args * x * jnp.cos(t), y)
    results = []
    for solver, lib in ((ours, ode), (theirs, diffrax)):
        terms = lib.ODETerm(vf)
        t, h = jnp.asarray(0.0), jnp.asarray(0.1)
        state = solver.init(terms, t, t + h, y0, 1.5)
        y = y0
        for _ in range(5):
            y, y_error, dense, state, result = solver.step(
                terms, t, t + h, y, 1.5, state, made_jump=False
            )
            assert lib.RESULTS[result] == lib.RESULTS[lib.RESULTS.successful]
            t = t + h
        assert set(dense) >= {"y0", "y1"}
        results.append((y, solver.func(terms, 0.0, y0, 1.5), y_error is None))
    (ours_y, ours_f, ours_none), (their_y, their_f, their_none) = results
    for a, b in zip(jax.tree.leaves(ours_y), jax.tree.leaves(their_y)):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    for a, b in zip(jax.tree.leaves(ours_f), jax.tree.leaves(their_f)):
        np.testing.assert_allclose(a, b, rtol=1e-14)
    assert ours_none == their_none
    assert ours.order(None) == theirs.order(None)


@pytest.mark.parametrize("solver", [ode.Tsit5(), ode.KenCarp4()], ids=lambda s: type(s).__name__)
def test_a_term_with_an_expensive_field_carries_nothing_as_in_diffrax(solver):
    # A Runge-Kutta method's `init` gives None for such a term, and `step` from None
    # evaluates the field at the step's start: the same step as from `init`'s state.
    class Expensive(ode.ODETerm):
        def is_vf_expensive(self, t0, t1, y, args):
            return True

    parts = (lambda t, y, args: -args * y, lambda t, y, args: jnp.sin(t) * y)
    expensive = ode.MultiTerm(Expensive(parts[0]), ode.ODETerm(parts[1]))
    plain = ode.MultiTerm(*map(ode.ODETerm, parts))
    t0, t1, y0 = jnp.asarray(0.0), jnp.asarray(0.1), jnp.asarray([1.0, 0.5])
    assert expensive.is_vf_expensive(t0, t1, y0, 1.5)
    assert not plain.is_vf_expensive(t0, t1, y0, 1.5)
    assert solver.init(expensive, t0, t1, y0, 1.5) is None
    from_none = solver.step(expensive, t0, t1, y0, 1.5, None, False)
    state = solver.init(plain, t0, t1, y0, 1.5)
    assert (state is not None) == isinstance(solver, ode.Tsit5)  # first same as last
    from_state = solver.step(plain, t0, t1, y0, 1.5, state, False)
    for a, b in zip(from_none[:2], from_state[:2]):
        np.testing.assert_allclose(a, b, rtol=1e-14)


def test_step_by_step_equals_diffeqsolve_for_an_implicit_solver():
    solver = ode.Kvaerno5(root_finder=ode.VeryChord(rtol=1e-10, atol=1e-10))
    terms, y0 = ode.ODETerm(field), jnp.asarray([1.0, 0.5])
    t, h = jnp.asarray(0.0), jnp.asarray(0.1)
    state, y = solver.init(terms, t, t + h, y0, 1.5), y0
    for _ in range(5):
        y, y_error, _, state, result = solver.step(terms, t, t + h, y, 1.5, state, False)
        assert ode.RESULTS[result] == ode.RESULTS[ode.RESULTS.successful]
        assert y_error.shape == y0.shape
        t = t + h
    whole = ode.diffeqsolve(terms, solver, 0.0, 0.5, 0.1, y0, 1.5)
    np.testing.assert_allclose(y, whole.ys[0], rtol=1e-12)


def test_diffrax_style_solver_arguments():
    assert ode.Tsit5(scan_stages=True) == ode.Tsit5(scan_stages=True)
    # Diffrax's tests set implicit tolerances through the default root finder.
    solver = eqx.tree_at(
        lambda s: (s.root_finder.rtol, s.root_finder.atol),
        ode.Kvaerno5(scan_stages=True),
        (1e-3, 1e-6),
        is_leaf=lambda x: x is None,
    )
    assert (solver.root_finder.rtol, solver.root_finder.atol) == (1e-3, 1e-6)
    assert isinstance(solver, ode.AbstractImplicitSolver) and isinstance(solver, ode.AbstractSolver)
    with pytest.raises(TypeError):
        ode.AbstractSolver()


# ------------------------------------------------------------ SaveAt(subs=...)


def test_subsaveat_equals_separate_solves():
    ts = jnp.linspace(0.0, 4.0, 5)
    norm = lambda t, y, args: jnp.sum(y**2)
    subs = {
        "grid": ode.SubSaveAt(ts=ts),
        "steps": ode.SubSaveAt(steps=True, fn=norm),
        "ends": [ode.SubSaveAt(t0=True), ode.SubSaveAt(t1=True)],
    }
    kwargs = dict(stepsize_controller=ode.PIDController(rtol=1e-8, atol=1e-8), max_steps=64)
    sol = solve(ode.Tsit5(), 0.1, saveat=ode.SaveAt(subs=subs, dense=True), **kwargs)
    assert set(sol.ts) == {"grid", "steps", "ends"} and len(sol.ys["ends"]) == 2
    for key, saveat in (
        ("grid", ode.SaveAt(ts=ts)),
        ("steps", ode.SaveAt(steps=True, fn=norm)),
    ):
        alone = solve(ode.Tsit5(), 0.1, saveat=saveat, **kwargs)
        # The same steps; the same values to rounding (two programs, fused apart).
        np.testing.assert_array_equal(sol.ts[key], alone.ts)
        np.testing.assert_allclose(sol.ys[key], alone.ys, rtol=1e-15, atol=0)
    np.testing.assert_array_equal(sol.ys["ends"][0], [[1.0, 0.5]])
    np.testing.assert_allclose(sol.ys["ends"][1], solve(ode.Tsit5(), 0.1, **kwargs).ys, rtol=1e-13)
    np.testing.assert_allclose(sol.evaluate(4.0), sol.ys["ends"][1][0], rtol=1e-14)


@pytest.mark.matrix  # 9 s
def test_subsaveat_gradient_and_structure_as_diffrax():
    def loss(rate, lib):
        subs = [lib.SubSaveAt(ts=jnp.array([1.0, 2.0])), lib.SubSaveAt(t1=True)]
        sol = lib.diffeqsolve(
            lib.ODETerm(field), lib.Tsit5(), 0.0, 4.0, 0.1, jnp.asarray([1.0, 0.5]), rate,
            saveat=lib.SaveAt(subs=subs),
            stepsize_controller=lib.PIDController(rtol=1e-9, atol=1e-9),
        )  # fmt: skip
        return sol.ys[0].sum() + 2 * sol.ys[1].sum()

    np.testing.assert_allclose(loss(0.7, ode), loss(0.7, diffrax), rtol=1e-7)
    np.testing.assert_allclose(jax.grad(loss)(0.7, ode), jax.grad(loss)(0.7, diffrax), rtol=1e-6)


def test_subsaveat_refuses_mixed_arguments():
    with pytest.raises(ValueError, match="subs"):
        ode.SaveAt(t1=True, subs=ode.SubSaveAt(t0=True))
    with pytest.raises(ValueError, match="saves nothing"):
        ode.SubSaveAt()


# ------------------------------------------------------------ every transformation order

ORDER_CASES = {
    "ReversibleHeun": (ode.ReversibleHeun(), ode.PIDController(rtol=1e-5, atol=1e-5), None),
    "LeapfrogMidpoint": (ode.LeapfrogMidpoint(), ode.ConstantStepSize(), None),
    "HalfSolver(Euler)": (
        ode.HalfSolver(ode.Euler()),
        ode.PIDController(rtol=1e-4, atol=1e-4),
        None,
    ),
    "Tsit5+SubSaveAt": (
        ode.Tsit5(),
        ode.PIDController(rtol=1e-7, atol=1e-7),
        ode.SaveAt(subs=[ode.SubSaveAt(ts=jnp.array([0.5, 1.5])), ode.SubSaveAt(t1=True)]),
    ),
}


def order_loss(case, adjoint):
    solver, controller, saveat = ORDER_CASES[case]
    saveat = saveat or ode.SaveAt(ts=jnp.array([0.5, 1.5, 2.0]))

    def loss(rate, scale):
        sol = ode.diffeqsolve(
            ode.ODETerm(field), solver, 0.0, 2.0, 0.05, scale * jnp.asarray([1.0, 0.5]), rate,
            saveat=saveat, stepsize_controller=controller, adjoint=adjoint,
        )  # fmt: skip
        return sum(jnp.sum(jnp.sin(y)) for y in jax.tree.leaves(sol.ys))

    return loss


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, marks=pytest.mark.matrix)
        for c in ("ReversibleHeun", "Tsit5+SubSaveAt", "LeapfrogMidpoint", "HalfSolver(Euler)")
    ],
)
def test_every_transformation_order(case):
    """grad(vmap), vmap(grad) with a shared and with a batched parameter, nested vmap,
    jacrev and jit(jvp), each against forward mode one sample at a time."""
    loss = order_loss(case, ode.RecursiveCheckpointAdjoint())
    forward = order_loss(case, ode.ForwardMode())
    rates, scales, rate = jnp.array([0.6, 0.8, 1.1]), jnp.array([0.9, 1.0, 1.2]), 0.8
    d_rate = np.array([jax.jacfwd(forward)(rate, s) for s in scales])  # shared rate
    d_own = np.array([jax.jacfwd(forward)(r, s) for r, s in zip(rates, scales)])
    tol = dict(rtol=1e-9, atol=1e-12)
    summed = jax.grad(lambda r: jnp.sum(jax.vmap(loss, (None, 0))(r, scales)))(rate)
    np.testing.assert_allclose(summed, d_rate.sum(), **tol)
    np.testing.assert_allclose(jax.vmap(jax.grad(loss), (None, 0))(rate, scales), d_rate, **tol)
    np.testing.assert_allclose(jax.vmap(jax.grad(loss))(rates, scales), d_own, **tol)
    nested = jax.vmap(jax.vmap(jax.grad(loss)))(rates[:, None], scales[:, None])
    np.testing.assert_allclose(nested.ravel(), d_own, **tol)
    jacobian = jax.jacrev(jax.vmap(loss))(rates, scales)
    np.testing.assert_allclose(jacobian, np.diag(d_own), **tol)
    direct = order_loss(case, ode.DirectAdjoint())
    jvp = jax.jit(lambda r, s: jax.jvp(lambda r_: direct(r_, s), (r,), (1.0,))[1])
    np.testing.assert_allclose([jvp(r, s) for r, s in zip(rates, scales)], d_own, **tol)
