"""Vector fields that hold or close over traced arrays, and `trace_once`.

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
from odesolve._closure import TracedFunction, shape_record, trace_once


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


@pytest.mark.matrix  # heavy: runs with -m matrix
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


# ----------------------------------------------------------------- trace_once


def multiply(x, y):
    return x * y


def test_a_plain_function_is_traced_and_called_through_its_trace():
    traced = trace_once(multiply, jnp.asarray(1.0), jnp.ones(3))
    assert isinstance(traced, TracedFunction) and not traced.own and not traced.captured
    np.testing.assert_array_equal(traced(jnp.asarray(2.0), jnp.arange(3.0)), [0.0, 2.0, 4.0])


def test_a_modules_arrays_are_its_own_leaves():
    rate = jnp.asarray(2.5)
    traced = trace_once(Decay(rate), 0.0, jnp.ones(2), None)
    assert traced.own == [rate] and not traced.captured
    np.testing.assert_array_equal(traced(0.0, jnp.ones(2), None), [-2.5, -2.5])


def test_what_a_closure_captured_becomes_a_leaf():
    scale = jnp.arange(1.0, 4.0)
    traced = trace_once(lambda x: {"out": scale * x}, jnp.ones(3))
    assert any(np.array_equal(leaf, scale) for leaf in jtu.tree_leaves(traced))
    out = traced(jnp.full(3, 2.0))
    assert set(out) == {"out"}
    np.testing.assert_array_equal(out["out"], [2.0, 4.0, 6.0])


def test_a_closure_over_a_tracer_is_traced_inside_jit():
    @jax.jit
    def run(scale, x):
        traced = trace_once(lambda v: scale * v, x)
        assert len(traced.captured) == 1
        return traced(x)

    np.testing.assert_array_equal(run(jnp.asarray(3.0), jnp.arange(2.0)), [0.0, 3.0])


def test_the_trace_is_kept_for_the_same_structure():
    """Outside any trace a Module of the same type and shapes reuses the jaxpr (so the
    solve's compilation is reused too), with its own new values."""
    first = trace_once(Decay(jnp.asarray(1.0)), 0.0, jnp.ones(2), None)
    again = trace_once(Decay(jnp.asarray(4.0)), 0.0, jnp.ones(2), None)
    assert again.jaxpr is first.jaxpr
    np.testing.assert_array_equal(again(0.0, jnp.ones(2), None), [-4.0, -4.0])
    other = trace_once(Decay(jnp.asarray(4.0)), 0.0, jnp.ones(3), None)
    assert other.jaxpr is not first.jaxpr


def test_a_closure_over_an_eager_tracer_is_never_kept():
    def value(rate):
        traced = trace_once(lambda t, y, a: -rate * y, 0.0, jnp.ones(2), None)
        return jnp.sum(traced(0.0, jnp.ones(2), None))

    assert jax.grad(value)(1.0) == -2.0
    assert jax.grad(value)(3.0) == -2.0  # a kept trace would hold the first call's tracer


def test_shape_records_are_hashable_and_strip_weak_types():
    weak = shape_record((jnp.asarray(1.0), jnp.ones(2)))
    strong = shape_record((jnp.asarray(1.0, jnp.asarray(1.0).dtype), jnp.ones(2)))
    assert weak == strong and hash(weak) == hash(strong)
    leaves, _ = weak
    assert all(isinstance(x, jax.ShapeDtypeStruct) and not x.weak_type for x in leaves)
    assert shape_record((jnp.ones(2),)) != shape_record((jnp.ones(3),))


def test_a_python_number_is_baked_into_the_trace():
    traced = trace_once(multiply, 1.0, jnp.ones(2))
    np.testing.assert_array_equal(traced(1.0, jnp.ones(2)), [1.0, 1.0])
    with pytest.raises(TypeError, match="traced for"):
        traced(5.0, jnp.ones(2))


def test_a_traced_function_crosses_jit_with_its_record_static():
    traced = trace_once(multiply, jnp.asarray(1.0), jnp.ones(2))

    @eqx.filter_jit
    def call(c, x, y):
        assert c.in_record == traced.in_record  # still static data, not tracers
        return c(x, y)

    np.testing.assert_array_equal(call(traced, jnp.asarray(3.0), jnp.ones(2)), [3.0, 3.0])
    assert jax.eval_shape(traced, jnp.asarray(1.0), jnp.ones(2)).shape == (2,)


@pytest.mark.parametrize(
    "args",
    [(jnp.asarray(1.0), jnp.ones(3)), (jnp.asarray(1.0), jnp.ones(2, jnp.int32)), (jnp.ones(2),)],
    ids=["shape", "dtype", "arity"],
)
def test_calling_with_other_arguments_raises(args):
    traced = trace_once(multiply, jnp.asarray(1.0), jnp.ones(2))
    with pytest.raises(TypeError, match="traced for"):
        traced(*args)
