"""Where a condition crosses zero on a step: a bracketed search, and the implicit-function
derivative of the root it finds.

The value comes from the search (no derivative: bisection-like updates are piecewise
constant); the derivative from the implicit function theorem, d t*/d theta =
-(d g/d theta) / (d g/d t) at the root, added as a zero-valued correction.
"""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jaxtyping import Array, Float


def _tolerance(tolerance, a, b):
    """Bracket width at which the search stops."""
    eps = jnp.finfo(jnp.result_type(a)).eps
    scale = jnp.maximum(jnp.abs(a), jnp.abs(b))
    tol = 4 * eps * jnp.maximum(scale, b - a)
    if tolerance is not None:
        rtol, atol = tolerance
        tol = jnp.maximum(tol, atol + rtol * scale)
    return tol


def _illinois(g: Callable, a, b, ga, gb, tol, max_iterations: int = 200):
    """A root of g in [a, b], where g(a) and g(b) have different signs.

    The Illinois variant of regula falsi (Dowell & Jarratt, BIT 11 (1971) 168-174): the
    secant through the bracket's ends, with the retained end's value halved when the same
    end is kept twice, which restores superlinear convergence; a midpoint step when the
    secant leaves the bracket. Returns the end with the smaller |g|.
    """

    def keep_going(s):
        a, b, ga, gb, _, i = s
        return (b - a > tol) & (ga != 0) & (gb != 0) & (i < max_iterations)

    def narrow(s):
        a, b, ga, gb, side, i = s
        c = (a * gb - b * ga) / jnp.where(gb == ga, 1, gb - ga)
        c = jnp.where((c > a) & (c < b) & (gb != ga), c, (a + b) / 2)
        gc = g(c)
        right = jnp.sign(gc) == jnp.sign(gb)  # the root is in [a, c]
        new_a, new_ga = jnp.where(right, a, c), jnp.where(right, ga, gc)
        new_b, new_gb = jnp.where(right, c, b), jnp.where(right, gc, gb)
        # Illinois: the end kept twice in a row has its value halved.
        new_ga = jnp.where(right & (side == 1), new_ga / 2, new_ga)
        new_gb = jnp.where(~right & (side == -1), new_gb / 2, new_gb)
        side = jnp.where(right, 1, -1).astype(jnp.int32)
        return new_a, new_b, new_ga, new_gb, side, i + 1

    init = (a, b, ga, gb, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
    a, b, ga, gb, _, _ = jax.lax.while_loop(keep_going, narrow, init)
    # Halving distorts the kept end's value, so compare true values before choosing.
    return jnp.where(jnp.abs(g(a)) <= jnp.abs(g(b)), a, b)


def _with_root_derivative(g: Callable, data, root):
    """`root` (a constant) with the implicit-function derivative of g's zero attached.

    The correction -g(root)/g'(root) has (nearly) zero value and, with g' held constant,
    derivative -(dg/dtheta)/g', which is the derivative of the root with respect to
    everything g depends on (`data`)."""
    value, slope = jax.jvp(lambda t: g(t, data), (root,), (jnp.ones_like(root),))
    slope = jax.lax.stop_gradient(slope)
    step = -value / jnp.where(slope == 0, 1, slope)
    step = jnp.where((slope == 0) | ~jnp.isfinite(step), 0, step)
    return root + (step - jax.lax.stop_gradient(step))


def crossing_time(
    g: Callable, data: Any, t_start: Float[Array, ""], t_end: Float[Array, ""], tolerance
) -> Float[Array, ""]:
    """Where t -> g(t, data) crosses zero in [t_start, t_end], given that its signs at the
    two ends differ (or one is zero). `data`: the arrays g depends on (the step's
    interpolant, `args`); the search sees them as constants, so no derivative enters the
    search loop (JAX cannot reverse-differentiate a while loop)."""
    freeze = lambda x: jax.lax.stop_gradient(x) if eqx.is_array(x) else x
    a, b, frozen_data = jtu.tree_map(freeze, (t_start, t_end, data))
    frozen = lambda t: g(t, frozen_data)
    root = _illinois(frozen, a, b, frozen(a), frozen(b), _tolerance(tolerance, a, b))
    return _with_root_derivative(g, data, root)
