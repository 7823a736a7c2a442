"""Vector fields that hold or close over traced arrays, and `adjoints.closure_convert`.

Regression tests for the lambda-wrapped loop bodies: JAX caches control-flow bodies by
hashing the callable, and hashing an `eqx.Module` that holds tracers is an error since
JAX 0.4.30 (jax-ml/jax#24722, equinox#768).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest

import odesolve as ode
from adjoints import JaxprClosure, TrivialClosure, closure_convert, shape_record


class Decay(eqx.Module):
    rate: jax.Array

    def __call__(self, t, y, args):
        return -self.rate * y


SAVE_TS = jnp.array([0.5, 1.0])


def solve_with(field, adjoint=ode.RecursiveCheckpointAdjoint(), throw=True):
    return ode.diffeqsolve(
        ode.ODETerm(field),
        ode.Tsit5(),
        0.0,
        1.0,
        0.1,
        jnp.ones(2),
        saveat=ode.SaveAt(ts=SAVE_TS),
        stepsize_controller=ode.PIDController(rtol=1e-8, atol=1e-8),
        adjoint=adjoint,
        throw=throw,
    ).ys


def expected(rate):
    return np.exp(-np.outer(np.atleast_1d(rate), SAVE_TS))[..., None] * np.ones(2)


def test_module_holding_tracers_built_inside_jit():
    solve = jax.jit(lambda rate: solve_with(Decay(2.0 * rate), throw=False))
    with jax.checking_leaks():
        ys = solve(jnp.asarray(0.5))
    np.testing.assert_allclose(ys, expected(1.0)[0], rtol=1e-7)


def test_default_solve_inside_jit_passes_the_leak_check():
    solve = jax.jit(lambda rate: solve_with(Decay(rate)))
    with jax.checking_leaks():
        ys = solve(jnp.asarray(1.0))
    np.testing.assert_allclose(ys, expected(1.0)[0], rtol=1e-7)


def test_module_holding_tracers_built_inside_vmap():
    rates = jnp.array([0.5, 1.0, 3.0])
    with jax.checking_leaks():
        ys = jax.vmap(lambda rate: solve_with(Decay(rate)))(rates)
    np.testing.assert_allclose(ys, expected(rates), rtol=1e-7)


def test_closure_over_a_traced_array_inside_jit():
    def solve(rate):
        return solve_with(lambda t, y, args: -rate * y, throw=False)

    with jax.checking_leaks():
        ys = jax.jit(solve)(jnp.asarray(3.0))
    np.testing.assert_allclose(ys, expected(3.0)[0], rtol=1e-7)


def test_closed_over_tracer_receives_a_tangent():
    def solve(rate):
        return solve_with(lambda t, y, args: -rate * y, adjoint=ode.ForwardMode())

    ys, dys = jax.jit(lambda r: jax.jvp(solve, (r,), (jnp.ones(()),)))(jnp.asarray(0.7))
    # y = exp(-rate t): dy/drate = -t y.
    np.testing.assert_allclose(ys, expected(0.7)[0], rtol=1e-7)
    np.testing.assert_allclose(dys, -SAVE_TS[:, None] * expected(0.7)[0], rtol=1e-6)


def test_same_module_type_with_new_values_does_not_retrace():
    traces = []

    class CountingDecay(eqx.Module):
        rate: jax.Array

        def __call__(self, t, y, args):
            traces.append(None)
            return -self.rate * y

    solve = eqx.filter_jit(lambda field: solve_with(field))
    solve(CountingDecay(jnp.asarray(1.0)))
    count = len(traces)
    ys = solve(CountingDecay(jnp.asarray(2.0)))
    assert len(traces) == count
    np.testing.assert_allclose(ys, expected(2.0)[0], rtol=1e-7)


# ----------------------------------------------------------------- closure_convert


def multiply(x, y):
    return x * y


def test_closure_free_function_is_trivially_converted():
    converted = closure_convert(multiply, 1.0, jnp.ones(3))
    assert isinstance(converted, TrivialClosure)
    np.testing.assert_array_equal(converted(2.0, jnp.arange(3.0)), [0.0, 2.0, 4.0])


def test_module_is_trivially_converted_and_its_arrays_are_leaves():
    rate = jnp.asarray(2.5)
    converted = closure_convert(Decay(rate), 0.0, jnp.ones(2), None)
    assert isinstance(converted, TrivialClosure)
    assert any(leaf is rate for leaf in jtu.tree_leaves(converted))
    np.testing.assert_array_equal(converted(0.0, jnp.ones(2), None), [-2.5, -2.5])


def test_closure_over_an_array_becomes_a_jaxpr_with_the_array_as_a_leaf():
    scale = jnp.arange(1.0, 4.0)
    converted = closure_convert(lambda x: {"out": scale * x}, jnp.ones(3))
    assert isinstance(converted, JaxprClosure)
    assert any(np.array_equal(leaf, scale) for leaf in jtu.tree_leaves(converted))
    out = converted(jnp.full(3, 2.0))
    assert set(out) == {"out"}
    np.testing.assert_array_equal(out["out"], [2.0, 4.0, 6.0])


def test_closure_over_a_tracer_is_converted_inside_jit():
    @jax.jit
    def run(scale, x):
        converted = closure_convert(lambda v: scale * v, x)
        assert isinstance(converted, JaxprClosure)
        return converted(x)

    np.testing.assert_array_equal(run(jnp.asarray(3.0), jnp.arange(2.0)), [0.0, 3.0])


def test_shape_records_are_hashable_and_strip_weak_types():
    weak = shape_record((1.0, jnp.ones(2)))
    strong = shape_record((jnp.asarray(1.0, jnp.float64), jnp.ones(2)))
    assert weak == strong and hash(weak) == hash(strong)
    leaves, _ = weak
    assert all(isinstance(x, jax.ShapeDtypeStruct) and not x.weak_type for x in leaves)
    assert shape_record((jnp.ones(2),)) != shape_record((jnp.ones(3),))


def converted_multiply(kind, *example_args):
    scale = jnp.asarray(2.0)
    fn = multiply if kind == "trivial" else (lambda x, y: scale * x * y)
    return closure_convert(fn, *example_args), (1.0 if kind == "trivial" else 2.0)


KINDS = ["trivial", "jaxpr"]


@pytest.mark.parametrize("kind", KINDS)
def test_converted_functions_have_hashable_static_structure(kind):
    converted, _ = converted_multiply(kind, jnp.asarray(1.0), jnp.ones(2))
    assert isinstance(converted, TrivialClosure if kind == "trivial" else JaxprClosure)
    hash(jtu.tree_structure(converted))  # hashes the static fields
    hash(converted.in_record)


@pytest.mark.parametrize("kind", KINDS)
def test_converted_from_a_python_scalar_accepts_a_strong_array(kind):
    converted, factor = converted_multiply(kind, 1.0, jnp.ones(2))
    if kind == "trivial":
        # The record strips weak types, so a float example and a float64 array are one type.
        out = converted(jnp.asarray(3.0, jnp.float64), jnp.ones(2))
        np.testing.assert_array_equal(out, [3.0 * factor, 3.0 * factor])
    else:
        # A traced conversion baked the number in: any other argument is refused loudly.
        with pytest.raises(TypeError, match="converted for"):
            converted(jnp.asarray(3.0, jnp.float64), jnp.ones(2))


@pytest.mark.parametrize("kind", KINDS)
def test_converted_from_a_python_scalar_uses_the_scalar_it_is_called_with(kind):
    converted, factor = converted_multiply(kind, 1.0, jnp.ones(2))
    if kind == "trivial":
        out = converted(5.0, jnp.ones(2))
        np.testing.assert_array_equal(out, [5.0 * factor, 5.0 * factor])
    else:
        np.testing.assert_array_equal(converted(1.0, jnp.ones(2)), [factor, factor])
        with pytest.raises(TypeError, match="converted for"):
            converted(5.0, jnp.ones(2))


@pytest.mark.parametrize("kind", KINDS)
def test_converted_function_crosses_jit_with_its_record_static(kind):
    converted, factor = converted_multiply(kind, jnp.asarray(1.0), jnp.ones(2))

    @eqx.filter_jit
    def call(c, x, y):
        assert c.in_record == converted.in_record  # still static data, not tracers
        return c(x, y)

    out = call(converted, jnp.asarray(3.0), jnp.ones(2))
    np.testing.assert_array_equal(out, [3.0 * factor, 3.0 * factor])
    assert jax.eval_shape(converted, jnp.asarray(1.0), jnp.ones(2)).shape == (2,)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "args",
    [(1.0, jnp.ones(3)), (1.0, jnp.ones(2, jnp.float32)), (1.0,)],
    ids=["shape", "dtype", "arity"],
)
def test_calling_with_other_shapes_raises(kind, args):
    converted, _ = converted_multiply(kind, 1.0, jnp.ones(2))
    with pytest.raises(TypeError, match=r"converted for"):
        converted(*args)
