"""Solves called outside any `jit`, as in a notebook: a repeated call with the same field
traces nothing again, and whatever is traced is still checked and converted."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode
from odesolve import _interpolation


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


def test_a_repeated_eager_solve_compiles_and_traces_nothing():
    # Diffrax's eager call is one cached dispatch; ours must be too. Work, not wall time, is
    # checked: after the first call, JAX reports no tracing, lowering or compilation.
    events: list[str] = []
    listen = lambda name, duration, **kwargs: events.append(name)
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        term = ode.ODETerm(lambda t, y, args: -y)
        solve = lambda: ode.diffeqsolve(term, ode.Tsit5(), 0.0, 1.0, 0.1, jnp.ones(2)).ys
        solve().block_until_ready()
        assert any(name.startswith("/jax/core/compile") for name in events), "first call"
        events.clear()
        for _ in range(3):
            solve().block_until_ready()
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert [name for name in events if name.startswith("/jax/core/compile")] == []


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


def _compile_events(calls) -> list[list[str]]:
    """For each of `calls`, the compile events JAX reported while it ran."""
    events: list[str] = []
    listen = lambda name, duration, **kwargs: events.append(name)
    jax.monitoring.register_event_duration_secs_listener(listen)
    per_call = []
    try:
        for call in calls:
            events.clear()
            jax.block_until_ready(call())
            per_call.append([name for name in events if name.startswith("/jax/core/compile")])
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    return per_call


def test_a_loop_over_end_times_compiles_at_most_twice():
    # Python numbers are fixed in the cached program; a call with other numbers takes the
    # plain path, whose compiled solve takes the times as inputs: a loop over t1 values
    # does not compile once per value.
    term = ode.ODETerm(lambda t, y, args: -y)
    pid = ode.PIDController(rtol=1e-6, atol=1e-6)
    solve = lambda t1: (
        lambda: (
            ode.diffeqsolve(
                term, ode.Tsit5(), 0.0, t1, 0.1, jnp.ones(2), stepsize_controller=pid
            ).ys
        )
    )
    t1s = [1.0, 1.5, 2.0, 2.5, 3.0]
    compiles = _compile_events([solve(t1) for t1 in t1s])
    assert compiles[2:] == [[], [], []], compiles
    for t1 in t1s:
        np.testing.assert_allclose(solve(t1)()[-1], np.exp(-t1), rtol=1e-5)


def test_save_times_are_checked_on_every_cached_call():
    term = ode.ODETerm(lambda t, y, args: -y)
    solve = lambda ts: (
        ode.diffeqsolve(term, ode.Tsit5(), 0.0, 1.0, 0.1, jnp.ones(2), saveat=ode.SaveAt(ts=ts)).ys
    )
    good = jnp.linspace(0.0, 1.0, 4)
    for _ in range(2):
        np.testing.assert_allclose(solve(good)[:, 0], np.exp(-good), rtol=1e-5)
    with pytest.raises(ode.InvalidSaveTimes, match="outside"):
        solve(jnp.linspace(0.0, 2.0, 4))  # the cached program's key: same shapes
    with pytest.raises(ValueError, match="not sorted"):
        solve(good[::-1])
    changing = np.linspace(0.0, 1.0, 4)  # NumPy arrays can change between calls
    solve(changing)
    changing[-1] = 5.0
    with pytest.raises(ode.InvalidSaveTimes, match="outside"):
        solve(changing)


@pytest.mark.matrix  # heavy: runs with -m matrix
def test_save_times_traced_inside_jit_are_not_kept():
    # Python-number times inside a `jit` whose save times are traced: the check of the
    # save times must not hold on to the tracer.
    term = ode.ODETerm(lambda t, y, args: -y)
    ts = jnp.linspace(0.0, 1.0, 4)
    solve = lambda ts: (
        ode.diffeqsolve(term, ode.Tsit5(), 0.0, 1.0, 0.1, jnp.ones(2), saveat=ode.SaveAt(ts=ts)).ys
    )
    with jax.checking_leaks():
        ys = jax.jit(solve)(ts)
    np.testing.assert_allclose(ys[:, 0], np.exp(-ts), rtol=1e-5)


class _Decay(eqx.Module):
    rate: jax.Array

    def __call__(self, t, y, args):
        return -self.rate * y


def test_an_eager_gradient_vmap_or_jvp_compiles_once():
    # As Diffrax's `filter_jit`: `grad`, `vmap` or `jvp` called outside `jit` traces the
    # solve with tracers for inputs; later calls with new values reuse its compilation.
    pid = ode.PIDController(rtol=1e-8, atol=1e-8)
    field = ode.ODETerm(lambda t, y, args: -args * y)
    solve = lambda term, rate, adjoint: ode.diffeqsolve(
        term, ode.Tsit5(), 0.0, 1.0, 0.1, jnp.ones(2), rate, stepsize_controller=pid,
        adjoint=adjoint,
    ).ys[-1, 0]  # fmt: skip

    def by_args(rate, adjoint=ode.RecursiveCheckpointAdjoint()):
        return solve(field, rate, adjoint)

    def by_module(rate, adjoint=ode.RecursiveCheckpointAdjoint()):
        return solve(ode.ODETerm(_Decay(rate)), None, adjoint)

    forward = lambda loss: functools.partial(loss, adjoint=ode.ForwardMode())
    jvp = lambda loss: lambda r: jax.jvp(forward(loss), (r,), (jnp.ones(()),))
    inputs = {jax.grad: lambda r: r, jax.vmap: lambda r: r * jnp.ones(3), jvp: lambda r: r}
    rates = [jnp.asarray(r) for r in (0.5, 1.0, 2.0)]
    for loss in (by_args, by_module):
        for transform, given in inputs.items():
            calls = [functools.partial(transform(loss), given(r)) for r in rates]
            compiles = _compile_events(calls)
            assert compiles[0] and compiles[1:] == [[], []], (loss.__name__, compiles)
        for r in rates:  # y(1) = exp(-rate): d/d rate = -exp(-rate)
            np.testing.assert_allclose(jax.grad(loss)(r), -np.exp(-r), rtol=1e-6)
            np.testing.assert_allclose(jvp(loss)(r)[1], -np.exp(-r), rtol=1e-6)
            np.testing.assert_allclose(jax.vmap(loss)(r * jnp.ones(3)), np.exp(-r), rtol=1e-6)


def test_an_eager_gradient_of_a_solve_with_an_event_compiles_once():
    # The event condition receives the solve's keyword arguments (times, terms...); its
    # trace is kept by their shapes, as the field's is, so a parameter fit calling
    # `jax.grad` outside `jit` (Diffrax: one compilation) compiles once, not per call.
    fall = ode.ODETerm(lambda t, y, g: jnp.stack([y[1], -g]))
    pid = ode.PIDController(rtol=1e-8, atol=1e-8)
    landed = ode.Event(lambda t, y, args, **kwargs: y[0])

    def impact_speed(g):
        sol = ode.diffeqsolve(
            fall, ode.Tsit5(), 0.0, jnp.inf, 0.1, jnp.array([10.0, 0.0]), g,
            stepsize_controller=pid, event=landed,
        )  # fmt: skip
        return sol.ys[-1, 1]

    gs = [jnp.asarray(g) for g in (9.0, 9.81, 11.0)]
    compiles = _compile_events([functools.partial(jax.grad(impact_speed), g) for g in gs])
    assert compiles[0] and compiles[1:] == [[], []], compiles
    for g in gs:  # v = -sqrt(2 h g): dv/dg = -sqrt(h / (2 g))
        np.testing.assert_allclose(jax.grad(impact_speed)(g), -np.sqrt(5.0 / g), rtol=1e-8)


def test_the_dense_solution_evaluated_eagerly_is_one_compiled_call(monkeypatch):
    # A plotting loop calls `sol.evaluate(t)` outside `jit`. Each call is one compiled
    # call: the interpolant's Python runs once, when traced, and new times (Python
    # numbers as arrays: Diffrax compiles again for each new number) compile nothing.
    sol = ode.diffeqsolve(
        ode.ODETerm(lambda t, y, args: -y), ode.Tsit5(), 0.0, 1.0, 0.1, jnp.ones(2),
        saveat=ode.SaveAt(dense=True), stepsize_controller=ode.PIDController(rtol=1e-8, atol=1e-8),
    )  # fmt: skip
    runs = []
    for name in ("value", "slope"):
        original = getattr(_interpolation, name)
        counted = lambda *a, _original=original, _name=name: runs.append(_name) or _original(*a)
        monkeypatch.setattr(_interpolation, name, counted)
    for given in (lambda t: t, jnp.asarray):
        for method in (sol.evaluate, sol.derivative, lambda t: sol.evaluate(0.1, t)):
            runs.clear()
            calls = [functools.partial(method, given(t)) for t in (0.3, 0.5, 0.7)]
            compiles = _compile_events(calls)
            assert compiles[1:] == [[], []] and len(runs) <= 2, (compiles, runs)
    np.testing.assert_allclose(sol.evaluate(0.5), np.exp(-0.5) * np.ones(2), rtol=1e-7)
    np.testing.assert_allclose(sol.derivative(0.5), -np.exp(-0.5) * np.ones(2), rtol=1e-5)
    np.testing.assert_allclose(sol.evaluate(0.1, 0.5), np.exp(-0.5) - np.exp(-0.1), rtol=1e-6)


def test_the_dense_solution_evaluated_eagerly_is_a_program_run_in_the_calling_thread():
    # XLA:CPU runs a program estimated at fewer than 1,000 operations in the thread that
    # calls it, and hands a larger one to a worker thread: waking it cost an eager
    # `sol.evaluate(t)` about 50 us, half its time. Locating a time must not scan all
    # `max_steps` rows of the interpolant on each call. Checked on the count XLA decides
    # by, for the default `max_steps`.
    sol = ode.diffeqsolve(
        ode.ODETerm(lambda t, y, args: -y), ode.Tsit5(), 0.0, 1.0, 0.1, jnp.ones(2),
        saveat=ode.SaveAt(dense=True), stepsize_controller=ode.PIDController(rtol=1e-8, atol=1e-8),
    )  # fmt: skip
    assert sol.interpolation.rows.t_end.shape[0] > 4096
    t = jnp.asarray(0.5)
    for method in (lambda s, t: s.evaluate(t), lambda s, t: s.derivative(t)):
        cost = jax.jit(method).lower(sol, t).compile().cost_analysis()
        assert cost["flops"] < 1000, cost["flops"]
    np.testing.assert_allclose(sol.evaluate(0.5), np.exp(-0.5) * np.ones(2), rtol=1e-7)
    assert np.all(np.isnan(sol.evaluate(1.5)))


@pytest.mark.matrix  # grad, vmap and jvp of both kinds of field stay in the suite
def test_eager_and_jitted_orders_compile_once_and_agree_with_the_exact_derivative():
    # y(1) = y0 exp(-rate): d/d rate = -y0 exp(-rate).
    pid = ode.PIDController(rtol=1e-8, atol=1e-8)

    def loss(rate, y0, adjoint=ode.RecursiveCheckpointAdjoint()):
        term = ode.ODETerm(_Decay(rate))
        return ode.diffeqsolve(
            term, ode.Tsit5(), 0.0, 1.0, 0.1, y0 * jnp.ones(2), stepsize_controller=pid,
            adjoint=adjoint,
        ).ys[-1, 0]  # fmt: skip

    summed = lambda rs, y0s: jnp.sum(jax.vmap(loss)(rs, y0s))
    forward = functools.partial(loss, adjoint=ode.ForwardMode())
    orders = {
        "grad(vmap)": lambda r, y: (jax.grad(summed)(r, y), -y * jnp.exp(-r)),
        "vmap(grad) shared": lambda r, y: (
            jax.vmap(jax.grad(loss), in_axes=(None, 0))(r[0], y),
            -y * jnp.exp(-r[0]),
        ),
        "vmap(grad) batched": lambda r, y: (jax.vmap(jax.grad(loss))(r, y), -y * jnp.exp(-r)),
        "vmap(vmap)": lambda r, y: (
            jax.vmap(jax.vmap(loss))(r.reshape(3, 1), y.reshape(3, 1)).ravel(),
            y * jnp.exp(-r),
        ),
        "jacrev": lambda r, y: (
            jnp.diag(jax.jacrev(lambda rs: jax.vmap(loss)(rs, y))(r)),
            -y * jnp.exp(-r),
        ),
        "jit(jvp)": lambda r, y: (_jitted_jvp(forward, r[0], y[0]), -y[0] * jnp.exp(-r[0])),
    }
    y0s = jnp.array([1.0, 2.0, 0.5])
    for name, order in orders.items():
        inputs = [(jnp.array([0.5, 1.0, 2.0]) * s, y0s * s) for s in (1.0, 1.5, 0.7)]
        compiles = _compile_events([functools.partial(order, *i) for i in inputs])
        assert compiles[0] and compiles[1:] == [[], []], (name, compiles)
        for i in inputs:
            got, exact = order(*i)
            np.testing.assert_allclose(got, exact, rtol=1e-6, err_msg=name)


@functools.partial(jax.jit, static_argnums=0)
def _jitted_jvp(loss, rate, y0):
    return jax.jvp(lambda r: loss(r, y0), (rate,), (jnp.ones(()),))[1]


def _heun_final_sum(rate):
    sol = ode.diffeqsolve(
        ode.ODETerm(_decay_by_cosine), ode.Heun(), 0.0, 4.0, 0.05, jnp.array([1.0, 0.5]), rate,
        stepsize_controller=ode.PIDController(rtol=1e-5, atol=1e-5),
        saveat=ode.SaveAt(ts=jnp.array([1.0, 2.5, 4.0])),
    )  # fmt: skip
    return jnp.sum(sol.ys**2)


def _decay_by_cosine(t, y, args):
    return y * jnp.cos(t) * args


def test_a_weak_typed_call_then_a_batched_gradient_of_the_same_field():
    # The field's trace is kept by its inputs' shapes: one made for a weakly typed rate
    # (`jnp.asarray(0.8)`) holds a conversion that a strong rate's does not, and reused
    # under `vmap(grad)` it gave the step a residual its layout lacked (a trace error).
    jax.grad(_heun_final_sum)(jnp.asarray(0.8))
    rates = jnp.array([0.5, 0.8])
    batched = jax.vmap(jax.grad(_heun_final_sum))(rates)
    one_by_one = jnp.stack([jax.grad(_heun_final_sum)(r) for r in rates])
    np.testing.assert_allclose(batched, one_by_one, rtol=1e-10)
