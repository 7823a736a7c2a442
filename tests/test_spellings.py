"""The same field written two ways costs the same: the reverse sweep linearises the field
again at every stage, so a field that reads `y[0]` several times would otherwise pay for
each read's transpose (checked by kernels per step of the compiled gradient, not by
timing), and both give one gradient."""

import jax
import jax.numpy as jnp
import numpy as np

import odesolve as ode
from odesolve._dedupe import deduplicated
from odesolve.bench import _kernels


def _unpack_state(t, y, p):
    x, z = y
    return jnp.stack([p[0] * x - p[1] * x * z, -p[2] * z + p[3] * x * z])


def _index_repeatedly(t, y, p):
    return jnp.stack([p[0] * y[0] - p[1] * y[0] * y[1], -p[2] * y[1] + p[3] * y[0] * y[1]])


def _gradient(field):
    def loss(p):
        sol = ode.diffeqsolve(
            ode.ODETerm(field),
            ode.Tsit5(),
            0.0,
            5.0,
            0.01,
            jnp.array([1.0, 1.0]),
            p,
            saveat=ode.SaveAt(ts=jnp.linspace(0.0, 5.0, 11)),
            stepsize_controller=ode.PIDController(rtol=1e-8, atol=1e-8),
            max_steps=256,
        )
        return jnp.sum(sol.ys**2)

    return jax.grad(loss)


def test_repeated_reads_of_the_state_cost_nothing_more_in_the_gradient():
    p = jnp.array([1.5, 1.0, 3.0, 1.0])
    counts = [_kernels.count(_gradient(f), p) for f in (_unpack_state, _index_repeatedly)]
    assert counts[0] is not None and counts[1] is not None
    assert counts[1]["per_step"] == counts[0]["per_step"]
    grads = [jax.jit(_gradient(f))(p) for f in (_unpack_state, _index_repeatedly)]
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-13)


def test_merging_keeps_values_and_gradients_and_leaves_effects_alone():
    y, p = jnp.array([1.0, 2.0]), jnp.array([1.5, 1.0, 3.0, 1.0])
    merged = deduplicated(lambda y, p: _index_repeatedly(0.0, y, p))
    fewer = len(jax.make_jaxpr(merged)(y, p).eqns)
    assert fewer < len(jax.make_jaxpr(lambda y, p: _index_repeatedly(0.0, y, p))(y, p).eqns)
    np.testing.assert_array_equal(merged(y, p), _index_repeatedly(0.0, y, p))
    grad = lambda f: jax.grad(lambda y: jnp.sum(f(y, p)))(y)
    np.testing.assert_array_equal(grad(merged), grad(lambda y, p: _index_repeatedly(0.0, y, p)))
    seen = []
    logged = deduplicated(lambda y: jax.debug.callback(lambda v: seen.append(v), y) or y[0] * y[0])
    assert float(jax.jit(logged)(y)) == 1.0
    jax.effects_barrier()
    assert len(seen) == 1
