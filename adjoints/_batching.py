"""How many samples a `vmap` around a solve runs together, found through JAX's public
batching rule for custom functions (`jax.custom_batching.custom_vmap`).

A loop written for one sample, vmapped by JAX, becomes a `while_loop` with a batched
predicate: every iteration then selects between the old and new value of every carry leaf,
copying every buffer and checkpoint slot of every sample. The lockstep loops (see
`_lockstep`) avoid that, and the default memory budget is shared by the samples, but both
need the batch size. `batch_size` asks for it: a function whose output is an empty array
of shape (1, 0), and whose batching rule answers (n, 0) for a batch of n, so that the
shape seen inside the `vmap` carries the size.

The batch size only chooses how the work is scheduled, never what is computed: every
sweep computes one cotangent per sample, and `vmap`'s own rules sum a cotangent over the
samples where the user's composition asks for a sum (`grad(vmap(f))`) and keep it where it
does not (`vmap(grad(f))`). A reverse sweep cannot tell those two apart, so it must never
sum over the batch by itself.
"""

import contextlib
import contextvars
from collections.abc import Iterator

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jax.custom_batching import custom_vmap
from jaxtyping import Array, Float, PyTree

from ._concrete import is_concrete


@custom_vmap
def _probe(leaves: list[Array]) -> Float[Array, "1 0"]:
    return jnp.zeros((1, 0), jnp.float32)


@_probe.def_vmap
def _probe_batched(
    size: int, in_batched: list[bool], leaves: list[Array]
) -> tuple[Float[Array, "size batch 0"], bool]:
    # Under nested `vmap`s the leaves are batched by the outer ones too: ask them.
    outer = _probed(leaves)
    return jnp.zeros((size, size * outer, 0), jnp.float32), True


def batch_size(*trees: PyTree) -> int:
    """The number of copies of a computation that the `vmap`s around this call run: the
    product of the sizes of the nested `vmap`s over which some array leaf of `trees` is
    batched (1 if none), or the size `runs_batched` gives. A `vmap` outside an enclosing
    `jax.jit` is not seen: the jitted function is traced for one sample."""
    return max(_probed(*trees), _KNOWN.get())


# A batch the probe cannot see: a loop's body is traced for one sample and batched by
# JAX afterwards, so within it every value looks unbatched (see `runs_batched`).
_KNOWN: contextvars.ContextVar[int] = contextvars.ContextVar("batch", default=1)


@contextlib.contextmanager
def runs_batched(size: int) -> Iterator[None]:
    """Within: `batch_size` is at least `size`. For a loop whose body is traced for one
    sample but that runs under a `vmap` of `size` samples (a reverse sweep's solves,
    each in the body of a scan over save times, batched as the sweep is)."""
    token = _KNOWN.set(max(size, _KNOWN.get()))
    try:
        yield
    finally:
        _KNOWN.reset(token)


def _probed(*trees: PyTree) -> int:
    """`batch_size` as the probe finds it."""
    # A known value is batched by no `vmap`; nor is a traced one whose primal, with the
    # tangents of an eager `grad` stripped, is known. The probe is traced on every call:
    # skipped, an eager gradient's call costs about a millisecond less.
    traced = [x for x in jtu.tree_leaves(trees) if eqx.is_array(x) and not is_concrete(x)]
    primals = [jax.lax.stop_gradient(x) for x in traced]
    primals = [x for x in primals if not is_concrete(x)]
    if not primals:
        return 1
    return _probe(primals).shape[0]
