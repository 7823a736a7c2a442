"""What a newcomer's first mistakes most likely were, said with the fix.

A user function that fails when the solve first calls it fails with Python's message
about the symptom ("cannot unpack non-iterable NoneType object", "takes 2 positional
arguments but 3 were given"); these say what to change instead. Each returns None when
the failure is not one it recognises, and the caller keeps Python's message.
"""

import contextlib
import inspect
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.tree_util as jtu
import numpy as np

from adjoints import (
    BacksolveAdjoint,
    DirectAdjoint,
    ForwardMode,
    ImplicitAdjoint,
    trace_time_value,
)

from ._flat import PyTree


def _signature(fn: Callable) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # builtins, some C callables: nothing to say
        return None


def _name(fn: Callable) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def wrong_signature(fn: Callable, what: str, call: str, *args: Any, **kwargs: Any) -> str | None:
    """`fn` cannot be called as `call` shows (`what`: the vector field, an event
    condition), read off its signature before anything runs."""
    sig = _signature(fn)
    if sig is None:
        return None
    try:
        sig.bind(*args, **kwargs)
    except TypeError:
        what = what[0].upper() + what[1:]
        return f"{what} is called as {call}, but {_name(fn)}{sig} cannot take that"
    return None


def list_of_numbers(y0: PyTree) -> str | None:
    """y0 given as a Python list (or tuple) of numbers: JAX reads it as that many
    separate scalar states, not as a vector, so the field is given a list."""
    if not isinstance(y0, (list, tuple)) or not y0:
        return None
    if not all(np.ndim(x) == 0 for x in y0) or len(jtu.tree_leaves(y0)) != len(y0):
        return None
    shown = "[" + ", ".join(_number(x) for x in y0) + "]"
    return (
        f"y0 is a Python {type(y0).__name__} of {len(y0)} numbers, which JAX treats as "
        f"{len(y0)} separate scalar states (a list is a container, not a vector), so the "
        f"vector field is given a {type(y0).__name__} and must return one. For a vector "
        f"state pass an array: y0=jnp.array({shown})"
    )


def _number(x: Any) -> str:
    """A number as written where it is known; a traced one (a list passed into `jit`)
    cannot be shown."""
    value = trace_time_value(x)
    return "..." if value is None else repr(float(value))


class _ArgsRead(Exception):
    """Raised by `_ArgsProbe` when the field reads the args it was given."""


class _ArgsProbe:
    """Stands in for args=None: any read of it (unpacking, indexing, an attribute, a
    length) raises `_ArgsRead`, so a field that reads args is told from one that fails
    for another reason without reading the error's text."""

    def _read(self, *_: Any) -> Any:
        raise _ArgsRead

    __iter__ = __getitem__ = __len__ = __getattr__ = _read


def _reads_args(fn: Callable, t0: Any, y0: Any) -> bool:
    try:
        jax.eval_shape(lambda t, y: fn(t, y, _ArgsProbe()), t0, y0)
    except _ArgsRead:
        return True
    except Exception:  # it fails before or without reading args: not this mistake
        return False
    return False


def args_not_passed(fn: Callable, error: Exception, t0: Any, y0: Any, args: PyTree) -> str | None:
    """The field read `args` (unpacked, indexed, an attribute) while none was passed."""
    if args is not None or not _reads_args(fn, t0, y0):
        return None
    frames = traceback.extract_tb(error.__traceback__)
    where = ""
    if frames and frames[-1].line:
        last = frames[-1]
        where = f" (at {last.filename}:{last.lineno}: `{last.line}`)"
    return (
        f"The vector field uses `args`{where}, but no args were passed to diffeqsolve, so "
        "it was given args=None. Pass them: diffeqsolve(terms, solver, t0, t1, dt0, y0, "
        "args=...)"
    )


_REVERSE_ONLY = "forward-mode autodiff (jvp) to a custom_vjp"
_BOTH_MODES = (ForwardMode, DirectAdjoint, ImplicitAdjoint)


@contextlib.contextmanager
def forward_mode_named(adjoint: Any) -> Iterator[None]:
    """`jax.jvp` or `jax.jacfwd` through an adjoint that only differentiates in reverse
    mode: JAX's refusal names its custom VJP; this names the adjoints that work."""
    try:
        yield
    except TypeError as e:
        # Under an adjoint with forward mode, the custom VJP is the field's own.
        if _REVERSE_ONLY not in str(e) or isinstance(adjoint, _BOTH_MODES):
            raise
        name = f"{type(adjoint).__name__}()"
        hessian = ""
        if isinstance(adjoint, BacksolveAdjoint):
            if adjoint.adjoint is not None:  # its gradient's forward solve ran by this one
                name = f"BacksolveAdjoint(adjoint={type(adjoint.adjoint).__name__}())"
            hessian = (
                " A BacksolveAdjoint gradient goes under jax.hessian or jax.jacfwd with "
                "BacksolveAdjoint() or BacksolveAdjoint(adjoint=DirectAdjoint())."
            )
        raise TypeError(
            f"jax.jvp / jax.jacfwd cannot differentiate diffeqsolve with adjoint={name}, "
            "which gives reverse-mode derivatives only (jax.grad, jax.vjp, jax.jacrev). For "
            "forward mode pass adjoint=odesolve.ForwardMode(), or odesolve.DirectAdjoint() "
            f"for both modes (jax.hessian).{hessian}"
        ) from None
