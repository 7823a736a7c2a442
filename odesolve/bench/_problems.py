"""The differential equations the workloads solve, as plain `f(t, y, args)` functions.

Each is written once and handed unchanged to every peer, so a ratio compares solvers on
the same arithmetic.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

LOTKA_VOLTERRA_RATES = (1.5, 1.0, 3.0, 1.0)  # (a, b, c, d)
LOTKA_VOLTERRA_Y0 = (1.0, 1.0)  # (prey, predators)
ROBERTSON_RATES = (0.04, 3e7, 1e4)  # (k1, k2, k3), Hairer-Wanner II, Section IV.1
ROBERTSON_Y0 = (1.0, 0.0, 0.0)


def lotka_volterra(t, y: Float[Array, "2"], args: Float[Array, "4"]) -> Float[Array, "2"]:
    """Prey x and predators z: dx = a x - b x z, dz = -c z + d x z."""
    a, b, c, d = args[0], args[1], args[2], args[3]
    x, z = y[0], y[1]
    return jnp.stack([a * x - b * x * z, -c * z + d * x * z])


def robertson(t, y: Float[Array, "3"], rates: Float[Array, "3"]) -> Float[Array, "3"]:
    """Robertson's chemical kinetics: stiff, rate constants spanning 9 orders of magnitude."""
    k1, k2, k3 = rates[0], rates[1], rates[2]
    y1, y2, y3 = y[0], y[1], y[2]
    fast = k2 * y2**2
    exchange = k1 * y1 - k3 * y2 * y3
    return jnp.stack([-exchange, exchange - fast, fast])


def neural_field(key: Array, dtype=jnp.float32) -> tuple:
    """W3's vector field: an MLP 2 -> 64 -> 64 -> 2 (softplus, final tanh).

    Returns `(params, field)`: the MLP's arrays, to pass as `args` and differentiate, and
    `field(t, y, params)`, which rebuilds the MLP around them (the activations are not
    arrays, so they cannot travel through `jit` or `args`).
    """
    mlp = eqx.nn.MLP(
        in_size=2,
        out_size=2,
        width_size=64,
        depth=2,
        activation=jax.nn.softplus,
        final_activation=jnp.tanh,
        dtype=dtype,
        key=key,
    )
    params, static = eqx.partition(mlp, eqx.is_array)

    def field(t, y, params):
        return eqx.combine(params, static)(y)

    return params, field
