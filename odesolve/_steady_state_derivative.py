"""`ImplicitAdjoint`'s derivative: a solve that ends at a steady state, differentiated by
the implicit function theorem instead of through its steps.

At a steady state f(t1, y1, theta) = 0, so dy1/dtheta = -J^{-1} df/dtheta with J =
df/dy at (t1, y1). The solve's own steps carry no derivative (`ImplicitAdjoint` runs
them on constants); the final state is given this one by adding a Newton correction of
value zero whose derivative is exactly that (J held constant, y1 a constant).
"""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jax import lax

from ._flat import PyTree, flat_spec, state_dtype
from ._solution import Solution
from ._solver._chord import frozen
from ._solver._implicit import as_complex, as_real
from ._term import ODETerm


@jax.custom_jvp
def _zero_carrying(x: jax.Array) -> jax.Array:
    """Zero, with the derivative of `x`: exactly zero in value (not x - x, which a
    compiler may reassociate with what it is added to)."""
    return jnp.zeros_like(x)


@_zero_carrying.defjvp
def _zero_carrying_jvp(primals: tuple, tangents: tuple) -> tuple[Any, Any]:
    (x,), (dx,) = primals, tangents
    return jnp.zeros_like(x), dx


def with_steady_state_derivative(
    sol: Solution, terms: ODETerm, args: PyTree, adjoint: Any = None
) -> Solution:
    """`sol` with its final state given the implicit-function derivative; the linear
    solve by `adjoint.linear_solver` (with `adjoint.tags`) when it names one."""
    t1 = lax.stop_gradient(sol.ts[-1])
    y1 = frozen(jtu.tree_map(lambda x: x[-1], sol.ys))
    spec = flat_spec(y1, state_dtype(jtu.tree_leaves(y1)))

    complex_state = jnp.iscomplexobj(spec.ravel(y1))
    # A complex state is solved for as its real and imaginary parts: the field need not
    # be holomorphic.
    to_real = as_real if complex_state else (lambda z: z)
    from_real = as_complex if complex_state else (lambda x: x)

    def field(x: jax.Array, term: ODETerm, a: PyTree) -> jax.Array:
        return to_real(spec.ravel(term.vf(t1, spec.unravel(from_real(x)), a)))

    flat = to_real(spec.ravel(y1))
    jacobian = jax.jacfwd(field)(flat, *frozen((terms, args)))
    correction = -_solve(jacobian, field(flat, terms, args), adjoint)
    shift = spec.unravel(from_real(_zero_carrying(correction)))
    ys = jtu.tree_map(lambda x, s: x.at[-1].add(s), sol.ys, shift)
    return eqx.tree_at(lambda s: s.ys, sol, ys)


def _solve(matrix: jax.Array, vector: jax.Array, adjoint: Any) -> jax.Array:
    """matrix^-1 vector: by the adjoint's Lineax solver when it has one, else dense LU."""
    solver = getattr(adjoint, "linear_solver", None)
    if solver is None:
        return jnp.linalg.solve(matrix, vector)
    import lineax as lx

    operator = lx.MatrixLinearOperator(matrix, getattr(adjoint, "tags", frozenset()))
    return lx.linear_solve(operator, vector, solver).value
