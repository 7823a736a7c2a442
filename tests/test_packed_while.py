"""`packed_while_loop`: a while loop whose strongly typed scalar carry leaves travel as one
vector per dtype. It computes what `lax.while_loop` computes, in every transformation a
solve's loop meets, and its body launches fewer kernels."""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from adjoints._packed_while import packed_while_loop
from odesolve.bench import _kernels


def _init(y0):
    """A carry like a step loop's: time and step size, a weakly typed scale, counters, a
    flag, a state."""
    return dict(
        t=jnp.float64(0.0),
        h=jnp.float64(0.1),
        scale=jnp.asarray(1.5),  # weakly typed: passes through unpacked
        steps=jnp.int32(0),
        rejected=jnp.int32(0),
        done=jnp.bool_(False),
        y=y0,
    )


def _cond(c):
    return (c["t"] < 1.0) & ~c["done"]


def _body(c):
    y = c["y"] + c["h"] * c["scale"] * jnp.sin(c["y"] + c["t"])
    error = jnp.sum(jnp.abs(y - c["y"])) * c["h"]
    accept = error < 0.5
    return dict(
        t=jnp.where(accept, c["t"] + c["h"], c["t"]),
        h=c["h"] * jnp.where(accept, 1.1, 0.5),
        scale=c["scale"] * 0.99,
        steps=c["steps"] + 1,
        rejected=c["rejected"] + jnp.where(accept, 0, 1).astype(jnp.int32),
        done=c["steps"] >= 40,
        y=jnp.where(accept, y, c["y"]),
    )


def _solve(loop, y0):
    final = loop(_cond, _body, _init(y0))
    return final["y"], final["t"], final["steps"], final["rejected"], final["scale"]


def _plain(cond, body, init):
    return lax.while_loop(cond, body, init)


def test_a_packed_loop_computes_what_the_plain_loop_computes():
    """Same values and dtypes (the weakly typed leaf stays weak) under jit, jvp and vmap
    (mapped over the state's elements, each sample's state is a scalar, packed too)."""
    y0 = jnp.array([0.3, -1.2, 2.0])
    for transform in (
        lambda loop: jax.jit(lambda y: _solve(loop, y)),
        lambda loop: jax.vmap(lambda y: _solve(loop, y)),
        lambda loop: lambda y: jax.jvp(lambda z: _solve(loop, z)[0], (y,), (jnp.ones_like(y),)),
    ):
        ours, theirs = transform(packed_while_loop), transform(_plain)
        for a, b in zip(jax.tree.leaves(ours(y0)), jax.tree.leaves(theirs(y0)), strict=True):
            assert a.dtype == b.dtype and jax.typeof(a).weak_type == jax.typeof(b).weak_type
            np.testing.assert_allclose(a, b, rtol=1e-15)
    batch = jnp.stack([y0, 2 * y0, -y0])
    ours = jax.vmap(lambda y: _solve(packed_while_loop, y))(batch)
    theirs = jax.vmap(lambda y: _solve(_plain, y))(batch)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-15)


def _kernels_per_iteration(loop) -> int:
    text = jax.jit(lambda y: _solve(loop, y)).lower(jnp.zeros(3)).compile().as_text()
    (found,) = _kernels.loops(text)
    return found.per_iteration.kernels


def test_the_scalars_changed_each_iteration_are_made_by_one_kernel():
    """Two float64 scalars, two int32 counters and a flag change every iteration: plain,
    each is a kernel of its own (XLA:CPU fuses no two outputs into one); packed, the
    counters and the flag travel in the float64 vector, made by one kernel (and copied
    by one: its new value gathers the old one's elements)."""
    plain, packed = _kernels_per_iteration(_plain), _kernels_per_iteration(packed_while_loop)
    assert packed <= plain - 5


def _not_done(c):
    return ~c["done"]


def _count(c):
    n = c["n"] + 1
    return dict(t=c["t"] + c["h"], h=c["h"], n=n, k=c["k"] + 1, done=n == 2**31 - 1)


def test_integers_travel_in_a_float_vector_only_where_it_holds_them_exactly():
    """An int32 counter near its largest value comes back exact beside float64 scalars;
    beside float32 ones (24 significant bits) it travels in a vector of its own, while an
    int8 and a flag travel in the float32 vector."""
    for float_dtype in (jnp.float64, jnp.float32):
        init = dict(
            t=jnp.asarray(0.0, float_dtype),
            h=jnp.asarray(0.5, float_dtype),
            n=jnp.int32(2**31 - 7),
            k=jnp.int8(-100),
            done=jnp.bool_(False),
        )

        ours = jax.jit(lambda c: packed_while_loop(_not_done, _count, c))(init)
        theirs = jax.jit(lambda c: _plain(_not_done, _count, c))(init)
        for key in init:
            assert ours[key].dtype == theirs[key].dtype
            assert ours[key] == theirs[key], (float_dtype, key)
        assert int(ours["n"]) == 2**31 - 1 and int(ours["k"]) == -94


def _scalars(n: int) -> dict:
    return dict(s=[jnp.float64(0.1 * i) for i in range(n)], y=jnp.zeros(3))


def _update_scalars(c):
    s, y = c["s"], c["y"]
    y = y + s[1] * jnp.sin(y + s[0])
    e = jnp.sum(jnp.abs(y - c["y"]))
    rest = [x + (i % 3) * e for i, x in enumerate(s[2:])]
    return dict(s=[s[0] + s[1], s[1] * jnp.exp(-e), *rest], y=y)


def test_many_scalars_travel_in_vectors_xla_assembles_in_one_kernel():
    """XLA:CPU assembles a vector of more than 8 elements with a kernel per element, so
    16 scalars travel as two vectors of 8: the loop launches at most 2 kernels more than
    with 8 scalars (one vector and its copy)."""

    def kernels(n: int) -> int:
        loop = lambda y: packed_while_loop(lambda c: c["s"][0] < 1.0, _update_scalars, _scalars(n))
        text = jax.jit(loop).lower(jnp.zeros(3)).compile().as_text()
        (found,) = _kernels.loops(text)
        return found.per_iteration.kernels

    assert kernels(16) <= kernels(8) + 2
