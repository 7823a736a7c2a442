"""Griewank's binomial rule for placing checkpoints: A. Griewank, "Achieving logarithmic
growth of temporal and spatial complexity in reverse automatic differentiation", Optim.
Methods Softw. 1 (1992) 35-54; A. Griewank and A. Walther, "Algorithm 799: revolve", ACM
TOMS 26 (2000) 19-45.

With s slots (one of them holding the initial state) and each tick recomputed at most t
times, a chain of beta(s, t) = C(s + t, s) ticks can be reversed, and this is optimal: the
number of forward ticks recomputed is t*n - beta(s + 1, t - 1) for beta(s, t-1) < n <=
beta(s, t). The rule below says where to put the next checkpoint when advancing from a
stored state towards the tick to reverse next; it serves the forward sweep (n known) and
every recomputation in the reverse sweep.
"""

from math import comb
from typing import overload

import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Int


def beta(s: int, t: int) -> int:
    """Longest chain reversible with s slots and t recomputations: C(s + t, s)."""
    return comb(s + t, s) if t >= 0 else 0


def forward_steps(n: int, s: int) -> int:
    """Ticks recomputed to reverse n ticks with s slots (Griewank's p(n, s))."""
    t = 0
    while beta(s, t) < n:
        t += 1
    return t * n - beta(s + 1, t - 1)


@overload
def next_checkpoint(base: int, target: int, free: int | Int[Array, ""]) -> int: ...
@overload
def next_checkpoint(
    base: Int[Array, ""], target: Int[Array, ""], free: Int[Array, ""]
) -> Int[Array, ""]: ...
def next_checkpoint(
    base: int | Int[Array, ""], target: int | Int[Array, ""], free: int | Int[Array, ""]
) -> int | Int[Array, ""]:
    """Where to store the next state when holding the state before tick `base` and needing
    the state before tick `target`, with `free` unused slots (free >= 1).

    Integer arithmetic only; works on Python ints and on traced int32 scalars. With
    l = target + 1 - base ticks left and f = free + 1 snapshots in revolve's counting, find
    the repetition number r with beta(f, r-1) < l <= beta(f, r), then split the range as
    Algorithm 799 does.
    """
    if isinstance(base, (int, np.integer)) and isinstance(target, (int, np.integer)):
        return _next_checkpoint_python(int(base), int(target), int(free))
    return _next_checkpoint_traced(base, target, free)


def _split_python(base: int, target: int, f: int, reps: int, reach: int) -> int:
    """Algorithm 799's choice, given reach = beta(f, reps) >= target + 1 - base."""
    ticks = target + 1 - base
    b1 = reach * reps // (f + reps)  # beta(f, reps - 1)
    b2 = b1 * f // (f + reps - 1) if f > 1 else 1  # beta(f - 1, reps - 1)
    b3 = 0 if f == 1 else (b2 * (f - 1) // (f + reps - 2) if f > 2 else 1)
    b4 = b2 * (reps - 1) // f  # beta(f, reps - 2)
    b5 = 0 if f < 3 else (b3 * (f - 2) // reps if f > 3 else 1)
    if ticks <= b1 + b3:
        return base + b4
    if ticks >= reach - b5:
        return base + b1
    return target + 1 - b2 - b3


def _split_traced(
    base: Int[Array, ""],
    target: Int[Array, ""],
    f: Int[Array, ""],
    reps: Int[Array, ""],
    reach: Int[Array, ""],
) -> Int[Array, ""]:
    """`_split_python` on int32 scalars, branch-free."""
    one = jnp.int32(1)
    ticks = target + 1 - base
    b1 = reach * reps // (f + reps)
    b2 = jnp.where(f > 1, b1 * f // jnp.maximum(f + reps - 1, one), one)
    b3 = jnp.where(f == 1, 0, jnp.where(f > 2, b2 * (f - 1) // jnp.maximum(f + reps - 2, one), one))
    b4 = b2 * (reps - 1) // f
    b5 = jnp.where(f < 3, 0, jnp.where(f > 3, b3 * (f - 2) // jnp.maximum(reps, one), one))
    return jnp.where(
        ticks <= b1 + b3,
        base + b4,
        jnp.where(ticks >= reach - b5, base + b1, target + 1 - b2 - b3),
    )


def _next_checkpoint_python(base: int, target: int, free: int) -> int:
    f, ticks = free + 1, target + 1 - base
    reps, reach = 0, 1
    while reach < ticks:
        reps += 1
        reach = reach * (reps + f) // reps
    return _split_python(base, target, f, reps, reach)


# (repetition number, beta(f, repetition number)) while searching for the repetition number.
_Counts = tuple[Int[Array, ""], Int[Array, ""]]


def _next_checkpoint_traced(
    base: int | Int[Array, ""], target: int | Int[Array, ""], free: int | Int[Array, ""]
) -> Int[Array, ""]:
    f = jnp.asarray(free + 1, jnp.int32)
    ticks = jnp.asarray(target + 1 - base, jnp.int32)

    def grow(state: _Counts) -> _Counts:
        reps, reach = state
        reps = reps + 1
        return reps, reach * (reps + f) // reps

    reps, reach = lax.while_loop(
        lambda s: s[1] < ticks, lambda s: grow(s), (jnp.int32(0), jnp.int32(1))
    )
    return _split_traced(
        jnp.asarray(base, jnp.int32), jnp.asarray(target, jnp.int32), f, reps, reach
    )
