"""An eager solve (outside `jit`) reads no parameter array's value: on a GPU each read is
a copy to the host and a wait for the device. Concreteness is asked of an array's type,
never of its value."""

import jax
import jax.numpy as jnp
import numpy as np

import odesolve as ode
from adjoints import is_concrete


def _mlp_field():
    keys = jax.random.split(jax.random.key(0), 2)
    params = dict(
        w1=jax.random.normal(keys[0], (8, 2)),
        b1=jnp.zeros(8),
        w2=jax.random.normal(keys[1], (2, 8)) / 8,
    )
    field = lambda t, y, p: p["w2"] @ jnp.tanh(p["w1"] @ y + p["b1"])
    return params, field


def test_eager_solve_reads_no_parameter_array(monkeypatch):
    params, field = _mlp_field()
    y0 = jnp.ones(2)

    def solve():
        return ode.diffeqsolve(
            ode.ODETerm(field),
            ode.Tsit5(),
            0.0,
            1.0,
            0.1,
            y0,
            params,
            saveat=ode.SaveAt(ts=jnp.linspace(0.0, 1.0, 5)),
            stepsize_controller=ode.PIDController(rtol=1e-6, atol=1e-6),
        )

    expected = solve().ys  # the first call traces and compiles
    read, asarray = [], np.asarray

    def recording(x, *args, **kwargs):
        read.append(x)
        return asarray(x, *args, **kwargs)

    monkeypatch.setattr(np, "asarray", recording)
    ys = solve().ys
    monkeypatch.undo()
    inputs = jax.tree_util.tree_leaves((params, y0))
    assert not [x for x in read if any(x is leaf for leaf in inputs)]
    np.testing.assert_array_equal(np.asarray(ys), np.asarray(expected))


def test_concreteness_of_arrays_tracers_and_python_values():
    assert is_concrete(jnp.ones(3)) and is_concrete(1.5) and is_concrete(np.ones(2))
    seen: list[bool] = []

    def record(x):
        seen.append(is_concrete(x))
        return x

    jax.jit(record)(jnp.ones(2))
    jax.grad(record)(1.0)
    jax.vmap(record)(jnp.ones(2))
    assert seen == [False, False, False]
