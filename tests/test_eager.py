"""Solves called outside any `jit`, as in a notebook: a repeated call with the same field
traces nothing again, and whatever is traced is still checked and converted."""

import time

import jax
import jax.numpy as jnp
import numpy as np

import odesolve as ode


def test_a_repeated_eager_solve_traces_the_field_once():
    traces = []

    def field(t, y, args):
        traces.append(1)  # runs only when JAX traces the field
        return -args * y

    term = ode.ODETerm(field)
    solve = lambda: ode.diffeqsolve(term, ode.Tsit5(), 0.0, 1.0, 0.1, jnp.ones(2), 2.0).ys
    np.testing.assert_allclose(solve()[-1], np.exp(-2.0), rtol=1e-5)
    first = len(traces)
    for _ in range(3):
        np.testing.assert_allclose(solve()[-1], np.exp(-2.0), rtol=1e-5)
    assert len(traces) == first


def test_an_eager_solve_costs_well_under_a_millisecond_or_two():
    term = ode.ODETerm(lambda t, y, args: -y)
    solve = lambda: ode.diffeqsolve(term, ode.Tsit5(), 0.0, 1.0, 0.1, jnp.ones(2)).ys
    solve().block_until_ready()
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(10):
            solve().block_until_ready()
        rounds.append((time.perf_counter() - start) / 10)
    # The best round, so that other processes on a loaded machine do not count: 0.5 to
    # 0.9 ms on 2 cores, and it was 3 ms when every call traced the field twice.
    assert min(rounds) < 2e-3, rounds


def test_fields_closing_over_traced_values_are_still_converted():
    # After eager solves of a field, one closing over a traced value (inside `grad`, which
    # does not stage, and inside `jit`) is traced and converted: nothing cached is reused.
    def solve(s):
        term = ode.ODETerm(lambda t, y, args: -s * y)
        return ode.diffeqsolve(term, ode.Tsit5(), 0.0, 1.0, 0.1, jnp.ones(2)).ys[-1, 0]

    term = ode.ODETerm(lambda t, y, args: -args * y)
    for _ in range(2):
        ode.diffeqsolve(term, ode.Tsit5(), 0.0, 1.0, 0.1, jnp.ones(2), 1.0)
        solve(1.0)
    np.testing.assert_allclose(jax.grad(solve)(3.0), -np.exp(-3.0), rtol=1e-5)
    np.testing.assert_allclose(jax.jit(solve)(3.0), np.exp(-3.0), rtol=1e-5)
    # The same field object inside `jit`, its argument traced.
    in_jit = jax.jit(lambda a: ode.diffeqsolve(term, ode.Tsit5(), 0.0, 1.0, 0.1, jnp.ones(2), a))
    np.testing.assert_allclose(in_jit(3.0).ys[-1, 0], np.exp(-3.0), rtol=1e-5)
