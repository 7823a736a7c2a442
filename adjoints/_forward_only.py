"""Outputs that refuse reverse-mode differentiation with a message naming the fix.

A plain `lax.while_loop` differentiates in forward mode only, and JAX's refusal to
transpose it names neither the adjoint that ran it nor what to pass instead. Guarding a
loop's outputs raises the message first: a transpose meets the guard before the loop.
"""

from typing import Any

import equinox as eqx
import equinox.internal as eqxi
import jax.tree_util as jtu


def forward_only(out: Any, msg: str) -> Any:
    """`out` unchanged; reverse-mode differentiation of any of its floating leaves raises
    `msg`. Forward mode (`jax.jvp`) passes through."""

    def guard(x: Any) -> Any:
        if not eqx.is_inexact_array(x):
            return x
        return eqxi.nondifferentiable_backward(x, msg=msg)

    return jtu.tree_map(guard, out)
