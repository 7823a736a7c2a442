"""Tight reference solutions from scipy, independent of every peer being measured.

Forward solutions come from `scipy.integrate.solve_ivp` (DOP853, or Radau for stiff
problems) at tolerances near machine precision. Gradients of a loss of the saved states
come from the forward sensitivity equations S' = f_y S + f_p, S(t0) = 0, solved alongside
y by the same scipy method: no peer's adjoint is involved. Everything runs in float64.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np


def _float64(tree):
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float64), tree)


def _numpy_function(fn: Callable) -> Callable:
    """`fn(t, y)` on JAX arrays, jitted once, as a float64 numpy function for scipy.

    It takes numpy inputs straight to the jitted call: scipy calls it ~20,000 times per
    reference, and converting with `jnp` first costs ~0.4 ms a call against ~0.02 ms.
    """
    compiled = jax.jit(fn)
    return lambda t, y: np.asarray(compiled(np.float64(t), np.asarray(y, np.float64)))


def solution(
    field: Callable, y0, t0: float, ts, args, *, method: str = "DOP853", rtol=1e-13, atol=1e-13
) -> np.ndarray:
    """y at each of `ts` (shape (len(ts),) + y0.shape) for dy/dt = field(t, y, args)."""
    try:  # a bench extra, imported only when a reference is needed
        import scipy.integrate
    except ImportError as error:
        raise ImportError("the bench's references need scipy: pip install -e '.[bench]'") from error

    y0, args = _float64(y0), _float64(args)
    shape = y0.shape
    flat = lambda t, y: field(t, y.reshape(shape), args).reshape(-1)
    options = {}
    if method in ("Radau", "BDF", "LSODA"):
        # The exact Jacobian: finite differences are too crude at rtol 1e-12.
        options["jac"] = _numpy_function(jax.jacfwd(flat, argnums=1))
    result = scipy.integrate.solve_ivp(
        _numpy_function(flat),
        (float(t0), float(ts[-1])),
        np.asarray(y0).reshape(-1),
        method=method,
        t_eval=np.asarray(ts, np.float64),
        rtol=rtol,
        atol=atol,
        **options,
    )
    if not result.success:
        raise RuntimeError(f"reference solve failed: {result.message}")
    return result.y.T.reshape((len(ts),) + shape)


def sensitivity_gradient(
    field: Callable, y0, t0: float, ts, params, loss: Callable, **solve_options
) -> np.ndarray:
    """d loss(ys) / d params for 1-D `params`, where ys are the states at `ts`.

    Solves the n + n p forward sensitivity system with `solution`, then contracts the
    sensitivities dy(t_i)/dp with d loss / d y(t_i).
    """
    y0, params = _float64(y0), _float64(params)
    n, p = y0.size, params.size

    def augmented(t, z, params):
        y, s = z[:n], z[n:].reshape(n, p)
        f_y = jax.jacfwd(field, argnums=1)(t, y, params)
        f_p = jax.jacfwd(field, argnums=2)(t, y, params)
        return jnp.concatenate([field(t, y, params), (f_y @ s + f_p).reshape(-1)])

    z0 = jnp.concatenate([y0, jnp.zeros(n * p, jnp.float64)])
    zs = solution(augmented, z0, t0, ts, params, **solve_options)
    ys, sensitivities = zs[:, :n], zs[:, n:].reshape(len(ts), n, p)
    dloss_dys = np.asarray(jax.grad(loss)(jnp.asarray(ys)))
    return np.einsum("tn,tnp->p", dloss_dys, sensitivities)


def max_abs_error(value, reference) -> float:
    """Largest absolute difference, over every leaf and entry."""
    return float(np.max(np.abs(np.asarray(value, np.float64) - np.asarray(reference))))


def max_rel_error(value, reference) -> float:
    """Largest |value - reference| / |reference| (gradients: every entry matters alike)."""
    value, reference = np.asarray(value, np.float64), np.asarray(reference, np.float64)
    return float(np.max(np.abs(value - reference) / np.abs(reference)))
