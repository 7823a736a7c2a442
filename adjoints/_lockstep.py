"""Loops that stay cheap under `vmap`: the samples move in lockstep.

Under `vmap` a `while_loop` with a batched predicate selects between the old and new value
of every carry leaf on every iteration, copying every large buffer. The loops here keep
large buffers out of that select: a body writes them only through scratch rows where its
sample is inactive. They are written for one sample and run under `vmap`; `batched` says
whether they are (see `_batching.batch_aware`).
"""

from collections.abc import Callable
from typing import TypeVar

import equinox as eqx
import equinox.internal as eqxi
import jax.numpy as jnp
import jax.tree_util as jtu
from jax import lax
from jaxtyping import Array, ArrayLike, Bool

from ._packed_while import packed_while_loop

Small = TypeVar("Small")  # a PyTree: the carry that is selected per sample
Large = TypeVar("Large")  # a PyTree: the carry written only through scratch rows
T = TypeVar("T")  # a PyTree


def lockstep_while(
    cond: Callable[[Small, Large], Bool[Array, ""]],
    body: Callable[[Small, Large, Bool[Array, ""]], tuple[Small, Large]],
    small: Small,
    large: Large,
    batched: bool = True,
    body_keeps: bool = False,
) -> tuple[Small, Large]:
    """`lax.while_loop` over the carry (small, large) that stays cheap under `vmap`.

    Under `vmap` a batched predicate makes JAX's while loop select between the old and new
    value of every carry leaf on every iteration, which copies every large buffer (all
    checkpoint slots of all samples) per step. Here the loop runs while any sample is
    going (the predicate reduced over the batch) and `body(small, large, active)` gets its
    own sample's predicate: it must leave `large` unchanged where `active` is False, by
    sending writes to scratch rows; only `small` is selected.

    `batched=False` (no `vmap` seen around the solve) runs a plain while loop with
    `active` True: the reduction and selects measurably slow a small unbatched loop.
    `body_keeps=True`: `body` itself leaves `small` unchanged where not `active`, so no
    select is added (see `where_any`)."""
    if not batched:
        return packed_while_loop(
            lambda s: cond(*s), lambda s: body(*s, jnp.asarray(True)), (small, large)
        )

    def outer_cond(state: tuple[Small, Large]) -> Bool[Array, ""]:
        return eqxi.unvmap_any(cond(*state))

    # Batched from the start, as the loop makes them anyway. JAX's while-loop batching
    # rule batches the body again until the set of batched carry leaves stops growing:
    # a leaf that starts unbatched and the body batches (a counter starting at 0) costs
    # one more pass over the body, and over every loop nested in it (a sixth of the
    # tracing time of a neural ODE's gradient).
    start = cond(small, large)
    small = jtu.tree_map(lambda x: jnp.where(start, x, x) if eqx.is_array(x) else x, small)

    def outer_body(state: tuple[Small, Large]) -> tuple[Small, Large]:
        active = cond(*state)
        new_small, new_large = body(*state, active)
        if body_keeps:
            return new_small, new_large
        keep = lambda n, o: jnp.where(active, n, o) if eqx.is_array(n) else n
        return jtu.tree_map(keep, new_small, state[0]), new_large

    return lax.while_loop(lambda s: outer_cond(s), lambda s: outer_body(s), (small, large))


def if_any(
    active: Bool[ArrayLike, ""],
    fn: Callable[[], T],
    otherwise: Callable[[], T],
    some_active: bool = False,
) -> T:
    """`fn()` where `active`, else `otherwise()`, for a batched `active` under `vmap`:
    `fn` runs only when some sample is active. Each round of a lockstep loop ends with a
    step; the last round, which only emits, would otherwise pay for a whole step (a
    quarter more field evaluations for a solve of four steps).

    `some_active=True`: the caller knows some sample is active (see
    `Loop.steps_every_round`), so `fn()` runs with no branch; a branch's predicate is
    reduced over the batch every round, and a GPU reads it back to the host."""
    if some_active:
        return fn()
    return lax.cond(eqxi.unvmap_any(active), fn, otherwise)


def at_most_once(go: Bool[ArrayLike, ""], fn: Callable[[T], T], value: T) -> T:
    """`fn(value)` if `go` (unbatched), else `value`, as a loop run at most once. A
    `cond` would do, but XLA copies a branch's output that is its input: a slot table
    passed through one is copied every tick (280 KB a tick for the default budget's
    70,000 slots of a small state), where a loop updates it in place."""

    def once(state: tuple[Bool[ArrayLike, ""], T]) -> tuple[Bool[ArrayLike, ""], T]:
        return jnp.asarray(False), fn(state[1])

    return lax.while_loop(lambda state: state[0], once, (go, value))[1]


def tree_where(active: Bool[ArrayLike, ""], new: T, old: T) -> T:
    """`new` where `active`, else `old`, leaf by leaf."""
    return jtu.tree_map(lambda a, b: jnp.where(active, a, b), new, old)


def where_any(
    active: Bool[ArrayLike, ""], fn: Callable[[], T], old: T, some_active: bool = False
) -> T:
    """`fn()` where `active`, else `old`; under `vmap`, `fn` runs only when some sample is
    active (see `if_any`).

    The select sits inside the branch, where XLA fuses it into the kernels that make
    `fn()`'s leaves, rather than one independent kernel per leaf outside it (see W6 in
    benchmarks/README.md for what those cost on XLA:CPU)."""
    return if_any(active, lambda: tree_where(active, fn(), old), lambda: old, some_active)
