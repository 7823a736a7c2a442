"""What can only be known while solving: checks of traced inputs, the final result, and
raising a failure (`throw=True`)."""

import os
import threading
from typing import Any

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from adjoints import trace_time_value

from ._config import Config, Params
from ._results import RESULTS, SolveError, failure_message, is_bad_input, is_okay
from ._solution import Solution
from ._validate import ends_without_t1, resolution, steps_of_dt0_throughout


def input_checks(config: Config, params: Params) -> Any:
    """Checks of traced inputs, which can only fail at run time (concrete ones were
    checked before tracing, with trace-time errors). Written so that NaN fails each
    check (a comparison with NaN is False)."""
    result = jnp.asarray(RESULTS.successful, jnp.int32)
    t_start, t_end, dt0 = params.t_start, params.t_end, params.dt0
    if dt0 is not None:
        # (t1 = inf with an event: the resolution near t0. An adaptive controller takes
        # dt0 only at t0.)
        t_far = jnp.where(jnp.isfinite(t_end), t_end, t_start)
        if not steps_of_dt0_throughout(params.controller):
            t_far = t_start
        t_max = jnp.maximum(jnp.abs(t_start), jnp.abs(t_far))
        fine = dt0 >= resolution(jax.lax.stop_gradient(t_max), t_start.dtype)
        bad_dt0 = ~(jnp.isfinite(dt0) & fine) & (t_end > t_start)
        result = jnp.where(bad_dt0, RESULTS.invalid_dt0, result)
    for save_ts in params.save_ts:
        if save_ts is None:
            continue
        ts = save_ts[:-1]
        ordered = jnp.all(ts[1:] >= ts[:-1]) & (ts[0] >= t_start) & (ts[-1] <= t_end)
        result = jnp.where(ordered & jnp.all(jnp.isfinite(ts)), result, RESULTS.invalid_save_times)
    valid = params.controller.times_are_valid(t_start, t_end)
    result = jnp.where(valid, result, RESULTS.invalid_step_times)
    result = jnp.where(_tolerances_are_valid(params.controller), result, RESULTS.invalid_tolerances)
    # t1 = inf is allowed only for an event or max_steps to end the solve (as checked at
    # trace time for a concrete t1).
    ends = ends_without_t1(config.event, config.max_steps)
    finite = jnp.isfinite(t_start) & (jnp.isfinite(t_end) | ends)
    return jnp.where(finite & ~jnp.isnan(t_end), result, RESULTS.nonfinite_times)


def _tolerances_are_valid(controller: Any) -> Any:
    """Traced tolerances are finite and >= 0 (concrete ones were checked when the
    controller was made): a negative one would accept every step without a word."""
    tolerances = controller.tolerances()
    valid = jnp.asarray(True)
    if tolerances is None:
        return valid
    for tol in tolerances:
        if eqx.is_array(tol) and not jnp.iscomplexobj(tol) and trace_time_value(tol) is None:
            tol = jax.lax.stop_gradient(tol)
            valid = valid & jnp.all(jnp.isfinite(tol) & (tol >= 0))
    return valid


def final_result(
    config: Config,
    params: Params,
    result: Int[Array, ""],
    t: Float[Array, ""],
    y: Float[Array, " n"],
) -> Any:
    unfinished = (result == RESULTS.successful.value) & (t < params.t_end)
    result = jnp.where(unfinished, RESULTS.max_steps_reached, result)
    # Fixed steps never reject, and a step forced at `PIDController(dtmin=...)` is
    # accepted whatever its error: a blow-up then only shows in the state.
    bad = (result == RESULTS.successful.value) & ~jnp.all(jnp.isfinite(y))
    return jnp.where(bad, RESULTS.nonfinite_state, result)


def raise_if_failed(sol: Solution, bad_inputs_only: bool = False) -> Solution:
    """`throw=True`. Outside any transformation the result is known here: raise one
    `SolveError` with our message. Inside one, a host callback raises it when the program
    runs (JAX then wraps it in its `JaxRuntimeError`, a `RuntimeError` too).
    `bad_inputs_only` (`throw=False`): raise only for a wrong input (`is_bad_input`), as
    Diffrax raises for one whatever `throw` is."""
    if ON_ERROR == "off":
        return sol
    raised = lambda c: not is_okay(c) and (not bad_inputs_only or is_bad_input(c))
    code = trace_time_value(sol.result._value)
    if code is not None:
        if np.all(code == RESULTS.successful.value):  # the usual case, told at once
            return sol
        codes = [RESULTS(int(c)) for c in np.ravel(code) if raised(RESULTS(int(c)))]
        if codes and ON_ERROR == "nan":
            return _as_nan(sol, True)
        if codes:
            raise SolveError(failure_message(max(codes)))
        return sol
    # One code however large a `vmap` batch is (the largest failure code over the batch,
    # `unvmap_max`): a batched callback would be unrolled into one per sample, thousands
    # of operations to compile for an ensemble.
    failed = ~is_okay(sol.result)
    if bad_inputs_only:
        value = sol.result._value
        inputs = [value == c.value for c in RESULTS if is_bad_input(c)]
        failed = failed & jnp.any(jnp.stack(inputs), axis=0)
    worst = eqxi.unvmap_max(jnp.where(failed, sol.result._value, RESULTS.successful.value))
    if ON_ERROR == "nan":
        return _as_nan(sol, worst != RESULTS.successful.value)
    arrays, rest = eqx.partition(sol, eqx.is_array)
    _raised.code = None
    try:
        checked = _raising(arrays, worst)
    except jax.errors.JaxRuntimeError:
        # Evaluated as it was traced (an eager `vmap`): the callback's failure reaches
        # here wrapped in JAX's runtime error, its text a host traceback. Raised as our
        # own, as a failure outside any transformation is.
        code = _raised.code
        if code is None:
            raise
        raise SolveError(failure_message(RESULTS(code))) from None
    return eqx.combine(checked, rest)


# The failure the host callback last raised on this thread (see `raise_if_failed`).
_raised = threading.local()


# What `throw=True` does with a failed solve, read from Equinox's `EQX_ON_ERROR` when
# imported, as Diffrax's check does: "raise" (the default; "breakpoint" raises too),
# "nan" (the solution's floating-point arrays become NaN: its result code is kept), or
# "off" (no check: the solution as with throw=False).
ON_ERROR = os.environ.get("EQX_ON_ERROR", "raise")


def _as_nan(sol: Solution, failing: Any) -> Solution:
    """`sol` with its floating-point arrays NaN where `failing` (the batch's, under
    `vmap`, as Equinox's check)."""
    floats, rest = eqx.partition(sol, eqx.is_inexact_array)
    nan = lambda x: jnp.where(failing, jnp.full_like(x, jnp.nan), x)
    return eqx.combine(jax.tree_util.tree_map(nan, floats), rest)


@jax.custom_jvp
def _raising(arrays: Any, worst: Any) -> Any:
    """`arrays` unchanged, or `SolveError` raised by a host callback when `worst` is a
    failure. A `pure_callback` whose output becomes the arrays: the check lives as long
    as anything of the solution is used, and a program with a side effect (such as
    `jax.debug.callback`) would be dispatched on JAX's slow path, about 0.1 ms a call on
    a CPU, failing or not."""
    # Branches defined once: an eager `vmap` of a solve then finds the cond's trace
    # kept by JAX, rather than compiling it again on every call.
    return jax.lax.cond(worst != RESULTS.successful.value, _fail, _pass, (arrays, worst))


def _fail(operands: tuple[Any, Any]) -> Any:
    arrays, worst = operands
    structs = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), arrays)
    return jax.pure_callback(_raise_failure, structs, worst)


def _pass(operands: tuple[Any, Any]) -> Any:
    return operands[0]


@_raising.defjvp
def _raising_jvp(primals: tuple, tangents: tuple) -> tuple:
    """The check passes derivatives through unchanged (the callback has none), each
    multiplied by a 1 that the check gives: the 1 is a residual of the linearisation,
    so reverse mode, which drops the primal solution (`jit(grad(loss))`), still runs
    the check and raises rather than returning the gradient of a failed solve."""
    arrays, worst = primals
    checked, one = _raising((arrays, jnp.ones((), jnp.float32)), worst)  # one check
    scale = lambda t: t * one.astype(t.dtype) if jnp.issubdtype(t.dtype, jnp.inexact) else t
    return checked, jax.tree_util.tree_map(scale, tangents[0])


def _raise_failure(code: np.ndarray) -> Any:
    _raised.code = int(code)
    raise SolveError(failure_message(RESULTS(int(code))))
