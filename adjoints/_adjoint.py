"""Adjoint strategies: how the solver's loop is run, and so how it is differentiated.

The solver builds a `Loop` and calls `adjoint.run_loop(loop, params, init, buffers)`;
nothing here knows about ODEs.
"""

from typing import Any

import equinox as eqx

from ._loop import Loop, run_plain


class AbstractAdjoint(eqx.Module):
    """Runs a `Loop`. Subclasses choose the differentiation strategy."""

    def run_loop(self, loop: Loop, params: Any, init: Any, buffers: tuple) -> tuple[Any, tuple]:
        raise NotImplementedError  # abstract


class ForwardMode(AbstractAdjoint):
    """Forward-mode autodiff through a plain `lax.while_loop`: `jax.jvp`, `jax.jacfwd`.
    Cheapest when there are fewer inputs than outputs to differentiate. No reverse mode."""

    def run_loop(self, loop, params, init, buffers):
        return run_plain(loop, params, init, buffers)


class RecursiveCheckpointAdjoint(AbstractAdjoint):
    """Discretise-then-optimise reverse mode with checkpointing (the default)."""

    checkpoints: int | None = None

    def run_loop(self, loop, params, init, buffers):
        return run_plain(loop, params, init, buffers)
