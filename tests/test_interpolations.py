"""Interpolating data, as Diffrax does: LinearInterpolation, CubicInterpolation,
backward_hermite_coefficients, linear_interpolation, rectilinear_interpolation, and
the local interpolations a solver in Diffrax's interface returns. References are
Diffrax's values on the same data, closed forms and finite differences."""

import itertools

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode

nan = np.nan
TS = jnp.array([0.0, 0.5, 1.2, 2.0, 3.1, 4.0, 5.0])
DATA = {
    "observed": [1.0, 2.0, 0.5, -1.0, 3.0, 2.0, 1.0],
    "missing inside": [1.0, nan, nan, -1.0, nan, 2.0, 1.0],
    "missing at both ends": [nan, nan, 0.5, nan, 3.0, nan, nan],
    "none observed": [nan] * 7,
}
OPTIONS = [
    dict(fill_forward_nans_at_end=fill, replace_nans_at_start=start)
    for fill, start in itertools.product([False, True], [None, 0.7])
]


def _close(ours, theirs, rtol=1e-12, atol=1e-12):
    leaves = jax.tree_util.tree_leaves
    for a, b in zip(leaves(ours), leaves(theirs), strict=True):
        np.testing.assert_allclose(
            np.asarray(a), np.asarray(b), rtol=rtol, atol=atol, equal_nan=True
        )
    assert jax.tree_util.tree_structure(ours) == jax.tree_util.tree_structure(theirs)


def _channels():
    """Two channels, each with its own missing values."""
    return jnp.stack([jnp.asarray(DATA["missing inside"]), jnp.asarray(DATA["observed"][::-1])], -1)


def _filled(lib, ys):
    """Every way of filling `ys`: each function under each option, in one compiled call."""

    def fill(ys):
        out = [lib.rectilinear_interpolation(TS, ys, start) for start in (None, 0.7)]
        for options, deriv0 in itertools.product(OPTIONS, (None, 0.3)):
            out.append(lib.linear_interpolation(TS, ys, **options))
            out.append(lib.backward_hermite_coefficients(TS, ys, deriv0=deriv0, **options))
        return out

    return jax.jit(fill)(ys)


def test_filling_missing_values_as_diffrax():
    ys = jnp.stack([jnp.asarray(v) for v in DATA.values()], -1)  # one channel per case
    _close(_filled(ode, ys), _filled(diffrax, ys))


def test_channels_and_pytrees_are_filled_one_channel_at_a_time():
    ys = {"a": _channels(), "b": (jnp.asarray(DATA["missing at both ends"]),)}
    start = {"a": jnp.array([0.1, 0.2]), "b": (0.7,)}
    options = dict(replace_nans_at_start=start, fill_forward_nans_at_end=True)
    fill = lambda lib: jax.jit(lambda ys: (
        lib.linear_interpolation(TS, ys, **options),
        lib.backward_hermite_coefficients(TS, ys, **options),
    ))(ys)  # fmt: skip
    _close(fill(ode), fill(diffrax))


def test_a_missing_value_is_filled_on_the_line_between_its_neighbours():
    ts = jnp.array([0.0, 1.0, 3.0, 4.0])
    ys = jnp.array([0.0, nan, 6.0, nan])
    filled = ode.linear_interpolation(ts, ys, fill_forward_nans_at_end=True)
    np.testing.assert_array_equal(filled, [0.0, 2.0, 6.0, 6.0])
    new_ts, held = ode.rectilinear_interpolation(ts, jnp.array([nan, 1.0, nan, 2.0]), 5.0)
    np.testing.assert_array_equal(new_ts, [0.0, 1.0, 1.0, 3.0, 3.0, 4.0, 4.0])
    np.testing.assert_array_equal(held, [5.0, 5.0, 1.0, 1.0, 1.0, 1.0, 2.0])


def _paths(lib, ys):
    coeffs = lib.backward_hermite_coefficients(TS, ys)
    return lib.LinearInterpolation(TS, ys), lib.CubicInterpolation(TS, coeffs)


def _read(lib, ys):
    """Both paths through `ys`, read at knots, between them and beyond: values and
    derivatives from either side, and an increment."""
    times = jnp.array([-0.5, 0.0, 0.3, 0.5, 1.9, 2.0, 4.7, 5.0, 5.5])

    def read(ys):
        out = []
        for path, left in itertools.product(_paths(lib, ys), (True, False)):
            out.append(jax.vmap(lambda t: path.evaluate(t, left=left))(times))
            out.append(jax.vmap(lambda t: path.derivative(t, left=left))(times))
            out.append(jax.tree_util.tree_map(
                lambda a, b: b - a, path.evaluate(0.3), path.evaluate(4.2)
            ))  # fmt: skip
        return out

    return jax.jit(read)(ys)


@pytest.mark.matrix  # 9 s
def test_paths_evaluate_as_diffrax_at_knots_between_and_beyond():
    ys = {"x": _channels(), "y": jnp.asarray(DATA["observed"])}
    _close(_read(ode, ys), _read(diffrax, ys))
    for path in _paths(ode, ys):
        assert float(path.t0) == 0.0 and float(path.t1) == 5.0 and path.ts_size == 7
        _close(path.evaluate(0.3, 4.2), jax.tree_util.tree_map(
            lambda a, b: b - a, path.evaluate(0.3), path.evaluate(4.2)
        ))  # fmt: skip


def test_a_linear_path_takes_the_piece_that_left_asks_for_at_a_knot():
    path = ode.LinearInterpolation(jnp.array([0.0, 1.0, 2.0]), jnp.array([0.0, 1.0, 3.0]))
    assert float(path.derivative(1.0)) == 1.0 and float(path.derivative(1.0, left=False)) == 2.0
    assert float(path.evaluate(1)) == 1.0  # an int time
    assert path.evaluate(jnp.array(1)).dtype == jnp.float64


@pytest.mark.matrix  # heavy: runs with -m matrix
def test_paths_under_jit_and_vmap():
    ys = jnp.asarray(DATA["observed"])
    for path in _paths(ode, ys):
        times = jnp.linspace(0.0, 5.0, 11)
        batched = jax.jit(jax.vmap(path.evaluate))(times)
        _close(batched, jnp.stack([path.evaluate(t) for t in times]))
    batch = jnp.stack([ys, 2 * ys])
    cubic_at = lambda y: _paths(ode, y)[1].evaluate(1.7)
    _close(jax.vmap(cubic_at)(batch), jnp.stack([cubic_at(ys), cubic_at(2 * ys)]))


def test_bad_knots_are_refused():
    with pytest.raises(ValueError, match="1-D"):
        ode.LinearInterpolation(jnp.zeros((2, 2)), jnp.zeros((2, 2)))
    with pytest.raises(ValueError, match="leading axis"):
        ode.LinearInterpolation(TS, jnp.zeros(3))
    with pytest.raises(ValueError, match="len\\(ts\\) - 1"):
        ode.CubicInterpolation(TS, (jnp.zeros(7),) * 4)
    with pytest.raises(Exception, match="strictly increasing"):
        ode.backward_hermite_coefficients(jnp.array([0.0, 2.0, 1.0]), jnp.zeros(3))


# ------------------------------------------------------- inside a vector field


def _forced_decay(lib, kind, adjoint=None, solver=None, adaptive=False):
    """y' = -y + x(t), x interpolating `points`: y(10) as a function of the data (Diffrax's
    forcing example)."""

    def end_value(points):
        ts = jnp.linspace(0.0, 10.0, points.shape[0])
        if kind == "cubic":
            x = lib.CubicInterpolation(ts, lib.backward_hermite_coefficients(ts, points))
        else:
            x = lib.LinearInterpolation(ts, points)
        # x' jumps at the knots: an adaptive controller is told to step onto them.
        controller = (
            lib.PIDController(rtol=1e-8, atol=1e-8, jump_ts=ts) if adaptive
            else lib.ConstantStepSize()
        )  # fmt: skip
        field = lib.ODETerm(lambda t, y, x: -y + x.evaluate(t))
        kwargs = {} if adjoint is None else dict(adjoint=adjoint)
        sol = lib.diffeqsolve(
            field, solver or lib.Tsit5(), 0, 10, 0.1, jnp.array(1.0), args=x,
            stepsize_controller=controller, **kwargs,
        )  # fmt: skip
        return sol.ys[0]

    return end_value


POINTS = jnp.array([3.0, 0.5, -0.8, 1.8])


@pytest.mark.parametrize("kind", ["cubic", "linear"])
def test_the_gradient_with_respect_to_the_data(kind):
    loss = _forced_decay(ode, kind)
    grad = jax.jit(jax.grad(loss))(POINTS)
    # With fixed steps y(10) is linear in the data: central differences are exact up
    # to rounding.
    eps, at = 1e-3, jax.jit(loss)
    fd = [(at(POINTS + eps * e) - at(POINTS - eps * e)) / (2 * eps) for e in np.eye(4)]
    np.testing.assert_allclose(grad, fd, rtol=1e-8, atol=1e-12)


@pytest.mark.matrix  # heavy: runs with -m matrix
def test_the_gradient_for_a_batch_of_data():
    batch = jnp.stack([POINTS, -POINTS, 2 * POINTS])
    grad = jax.jit(jax.grad(_forced_decay(ode, "cubic")))
    per_sample = jax.jit(jax.vmap(grad))(batch)
    _close(per_sample, jnp.stack([grad(p) for p in batch]), rtol=1e-12)


@pytest.mark.matrix
@pytest.mark.parametrize("kind", ["cubic", "linear"])
def test_the_gradient_as_diffrax_with_steps_onto_the_knots(kind):
    grad = lambda lib: jax.jit(jax.grad(_forced_decay(lib, kind, adaptive=True)))(POINTS)
    _close(grad(ode), grad(diffrax), rtol=1e-9)


@pytest.mark.matrix
@pytest.mark.parametrize("kind", ["cubic", "linear"])
@pytest.mark.parametrize(
    "adjoint",
    [ode.DirectAdjoint(), ode.BacksolveAdjoint(), ode.ReversibleAdjoint(), ode.ForwardMode()],
    ids=lambda a: type(a).__name__,
)
def test_the_gradient_under_every_adjoint(kind, adjoint):
    reversible = isinstance(adjoint, ode.ReversibleAdjoint)
    solver = ode.Reversible(ode.Tsit5()) if reversible else ode.Tsit5()
    reference = jax.jit(jax.grad(_forced_decay(ode, kind, solver=solver)))(POINTS)
    loss = _forced_decay(ode, kind, adjoint, solver)
    derivative = jax.jacfwd if isinstance(adjoint, ode.ForwardMode) else jax.grad
    # BacksolveAdjoint solves the continuous adjoint backwards (here across the kinks of
    # a linear forcing): close to, not equal to, the discrete gradient. ReversibleAdjoint
    # rebuilds the states by undoing steps, exact up to rounding.
    atol = {ode.BacksolveAdjoint: 1e-5, ode.ReversibleAdjoint: 1e-10}.get(type(adjoint), 1e-12)
    _close(jax.jit(derivative(loss))(POINTS), reference, rtol=1e-9, atol=atol)


# ------------------------------------------------------- local interpolations


class _Midpoint(ode.FourthOrderPolynomialInterpolation):
    c_mid = np.array([0.1, 0.2, 0.3, -0.2, 0.05])


class _DiffraxMidpoint(diffrax.FourthOrderPolynomialInterpolation):
    c_mid = np.array([0.1, 0.2, 0.3, -0.2, 0.05])


def _locals(lib, midpoint, t1=2.5):
    y0 = {"a": jnp.array([0.3, -1.2, 2.0]), "b": jnp.array(1.0)}
    y1 = jax.tree_util.tree_map(lambda x: 2 * x + 1, y0)
    k = jax.tree_util.tree_map(lambda x: jnp.stack([0.1 * x, 0.3 * x, -x, 0.5 * x, 0.7 * x]), y0)
    times = dict(t0=0.5, t1=t1)
    return [
        lib.LocalLinearInterpolation(**times, y0=y0, y1=y1),
        lib.ThirdOrderHermitePolynomialInterpolation.from_k(**times, y0=y0, y1=y1, k=k),
        lib.ThirdOrderHermitePolynomialInterpolation(
            **times, y0=y0, y1=y1, k0=_row(k, 1), k1=_row(k, 2)
        ),
        midpoint(**times, y0=y0, y1=y1, k=k),
    ]


def test_local_interpolations_as_diffrax():
    def read(lib, midpoint):
        out = []
        for path in _locals(lib, midpoint):
            assert isinstance(path, lib.AbstractLocalInterpolation)
            for t in (0.5, 0.9, 1.5, 2.5):
                out += [path.evaluate(t), path.derivative(t)]
            out.append(jax.tree_util.tree_map(
                lambda a, b: b - a, path.evaluate(0.9), path.evaluate(2.1)
            ))  # fmt: skip
        return out

    ours = jax.jit(lambda: read(ode, _Midpoint))()
    _close(ours, jax.jit(lambda: read(diffrax, _DiffraxMidpoint))())
    for path in _locals(ode, _Midpoint):  # the increment as the path gives it
        _close(path.evaluate(0.9, 2.1), jax.tree_util.tree_map(
            lambda a, b: b - a, path.evaluate(0.9), path.evaluate(2.1)
        ))  # fmt: skip


def test_local_interpolations_on_a_step_of_no_length_as_diffrax():
    # t1 == t0: the interpolant is y0, constant in t (Diffrax's value, derivative and
    # derivative of the value in t: no slope of a step read as of unit length).
    def read(lib, midpoint):
        out = []
        for path in _locals(lib, midpoint, t1=0.5):
            slope = jax.jvp(path.evaluate, (0.5,), (1.0,))[1]
            out += [path.evaluate(0.5), slope, path.derivative(0.5)]
        return out

    ours = read(ode, _Midpoint)
    _close(ours, read(diffrax, _DiffraxMidpoint))
    assert all(float(jnp.max(jnp.abs(x))) == 0 for x in jax.tree_util.tree_leaves(ours[1::3]))


def _row(k, i):
    return jax.tree_util.tree_map(lambda x: x[i], k)
