"""A table of bad inputs: each raises one exception of a stated type whose message holds
the stated words (the argument, the value or the fix). Inputs inside `jit` can only be
checked when the program runs; with `throw=True` they fail with JAX's runtime error
carrying our message (`SolveError`'s). A new argument gets its row here.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode

PID = ode.PIDController(rtol=1e-8, atol=1e-8)
TERM = ode.ODETerm(lambda t, y, args: -y)
Y0 = jnp.array([1.0, 2.0])


def solve(**overrides):
    kwargs = dict(
        terms=ode.ODETerm(lambda t, y, args: -y),
        solver=ode.Tsit5(),
        t0=0.0,
        t1=1.0,
        dt0=0.1,
        y0=jnp.array([1.0, 2.0]),
    )
    kwargs.update(overrides)
    return ode.diffeqsolve(**kwargs)


def jitted(make_kwargs, value):
    """A solve whose input `value` is traced: checked only when it runs."""
    return eqx.filter_jit(lambda v: solve(**make_kwargs(v)).ys)(jnp.asarray(value))


RUN_TIME = (RuntimeError,)  # JaxRuntimeError carrying SolveError's message

CASES = {
    # ---- checked when traced
    "dt0 below the float32 resolution of time": (
        lambda: solve(
            solver=ode.Euler(),
            t0=jnp.float32(99999),
            t1=jnp.float32(1e5),
            dt0=jnp.float32(0.01),
            y0=jnp.array([1.0], jnp.float32),
        ),
        ValueError,
        r"dt0=0.0099.* below the resolution of float32 times near t=100000",
    ),
    "dt0 below the float64 resolution of time": (
        lambda: solve(solver=ode.Euler(), t0=1e14 - 1, t1=1e14, dt0=0.01),
        ValueError,
        r"dt0=0.01 is below the resolution of float64 .* pass \|dt0\| >= 0.03125",
    ),
    "event condition returning None": (
        lambda: solve(event=ode.Event(lambda t, y, args, **kwargs: None)),
        ValueError,
        r"event condition .* returned None; each condition must return a scalar",
    ),
    "user Jacobian of the wrong shape": (
        lambda: solve(
            solver=ode.Kvaerno5(jacobian=lambda t, y, args: jnp.eye(3)),
            stepsize_controller=PID,
            dt0=None,
        ),
        ValueError,
        r"jacobian=.*returned shape \(3, 3\), but the state has 2 components",
    ),
    "checkpoints not an integer": (
        lambda: ode.RecursiveCheckpointAdjoint(checkpoints=2.5),
        TypeError,
        r"checkpoints=2.5\): pass an integer",
    ),
    # ---- checked when the solve runs
    "traced NaN dt0": (
        lambda: jitted(lambda d: dict(dt0=d), jnp.nan),
        RUN_TIME,
        r"invalid_dt0.*must be finite",
    ),
    "traced inf dt0": (
        lambda: jitted(lambda d: dict(dt0=d), jnp.inf),
        RUN_TIME,
        r"invalid_dt0",
    ),
    "traced dt0 below the resolution of time": (
        lambda: jitted(lambda t0: dict(solver=ode.Euler(), t0=t0, t1=1e14, dt0=0.01), 1e14 - 1),
        RUN_TIME,
        r"invalid_dt0.*below the resolution",
    ),
    "traced NaN t1": (
        lambda: jitted(lambda t1: dict(t1=t1, dt0=None, stepsize_controller=PID), jnp.nan),
        RUN_TIME,
        r"nonfinite_times.*t0 or t1 is NaN or inf",
    ),
    "traced inf t1 without an event or max_steps": (
        lambda: jitted(
            lambda t1: dict(t1=t1, dt0=None, stepsize_controller=PID, max_steps=None), jnp.inf
        ),
        RUN_TIME,
        r"nonfinite_times.*t1 may be inf only when an Event or an integer max_steps ends",
    ),
    "traced NaN t0": (
        lambda: jitted(lambda t0: dict(t0=t0), jnp.nan),
        RUN_TIME,
        r"nonfinite_times",
    ),
    "traced NaN save time": (
        lambda: jitted(lambda ts: dict(saveat=ode.SaveAt(ts=ts)), [0.5, jnp.nan]),
        RUN_TIME,
        r"invalid_save_times.*must be finite",
    ),
    "traced unsorted StepTo times": (
        lambda: jitted(
            lambda ts: dict(dt0=None, stepsize_controller=ode.StepTo(ts)), [0, 0.6, 0.4, 1]
        ),
        RUN_TIME,
        r"invalid_step_times.*strictly monotonic",
    ),
    "traced repeated StepTo times": (
        lambda: jitted(
            lambda ts: dict(dt0=None, stepsize_controller=ode.StepTo(ts)), [0, 0.5, 0.5, 1]
        ),
        RUN_TIME,
        r"invalid_step_times",
    ),
    "traced StepTo times not ending at t1": (
        lambda: jitted(
            lambda ts: dict(dt0=None, stepsize_controller=ode.StepTo(ts)), [0, 0.5, 0.9]
        ),
        RUN_TIME,
        r"invalid_step_times.*ts\[-1\] == t1",
    ),
    "traced StepTo times not starting at t0": (
        lambda: jitted(
            lambda ts: dict(dt0=None, stepsize_controller=ode.StepTo(ts)), [0.1, 0.5, 1]
        ),
        RUN_TIME,
        r"invalid_step_times.*ts\[0\] == t0",
    ),
    "traced NaN step_ts": (
        lambda: jitted(
            lambda ts: dict(stepsize_controller=ode.PIDController(1e-6, 1e-6, step_ts=ts)),
            [0.5, jnp.nan],
        ),
        RUN_TIME,
        r"invalid_step_times.*step_ts. and .jump_ts. must be finite",
    ),
    "traced infinite jump_ts of ClipStepSizeController": (
        lambda: jitted(
            lambda ts: dict(
                stepsize_controller=ode.ClipStepSizeController(
                    ode.PIDController(1e-6, 1e-6), jump_ts=ts
                )
            ),
            [0.5, jnp.inf],
        ),
        RUN_TIME,
        r"invalid_step_times.*must be finite",
    ),
    # ---- checked when constructed or traced (each once failed with another library's words)
    "a step forced at dtmin that blows up": (
        lambda: solve(
            terms=ode.ODETerm(lambda t, y, args: -1e6 * (y - jnp.cos(t))),
            stepsize_controller=ode.PIDController(rtol=1e-5, atol=1e-5, dtmin=0.01),
        ),
        ode.SolveError,
        r"nonfinite_state.*dtmin",
    ),
    "complex save times": (
        lambda: ode.SaveAt(ts=jnp.array([0.5 + 0j])),
        TypeError,
        r"SaveAt\(ts=...\): pass real times, got dtype complex",
    ),
    "save times given as strings": (
        lambda: ode.SaveAt(ts=["a", "b"]),
        TypeError,
        r"SaveAt\(ts=...\): pass real times",
    ),
    "SaveAt fn that is not callable": (
        lambda: ode.SaveAt(t1=True, fn=3),
        TypeError,
        r"SaveAt\(fn=3\): pass a function fn\(t, y, args\)",
    ),
    "SaveAt fn with the wrong signature": (
        lambda: solve(saveat=ode.SaveAt(t1=True, fn=lambda y: y)),
        TypeError,
        r"SaveAt\(fn=.*\) failed when called as fn\(t0, y0, args\).*def fn\(t, y, args\)",
    ),
    "SaveAt fn returning a string": (
        lambda: solve(saveat=ode.SaveAt(subs=[ode.SubSaveAt(t1=True, fn=lambda t, y, a: "s")])),
        TypeError,
        r"SaveAt\(fn=.*\) failed .* PyTree of arrays",
    ),
    "2-D PID step times": (
        lambda: ode.PIDController(rtol=1e-5, atol=1e-5, step_ts=jnp.array([[0.5, 0.2]])),
        ValueError,
        r"PIDController\(step_ts=...\): pass a 1-D array of times, got shape \(1, 2\)",
    ),
    "NaN PID jump time": (
        lambda: ode.PIDController(rtol=1e-5, atol=1e-5, jump_ts=jnp.array([0.5, jnp.nan])),
        ValueError,
        r"jump_ts\[1\]=nan: times must be finite",
    ),
    "a norm that is not callable": (
        lambda: ode.PIDController(rtol=1e-5, atol=1e-5, norm=3),
        TypeError,
        r"PIDController\(norm=3\): pass a function",
    ),
    "a norm returning a vector": (
        lambda: solve(stepsize_controller=ode.PIDController(1e-5, 1e-5, norm=jnp.abs)),
        ValueError,
        r"PIDController\(norm=.*\) returned shape \(2,\): a norm maps .* to one scalar",
    ),
    "a PID coefficient given as a string": (
        lambda: ode.PIDController(rtol=1e-5, atol=1e-5, pcoeff="a"),
        TypeError,
        r"PIDController\(pcoeff='a'\): pass a number",
    ),
    "a NaN PID coefficient": (
        lambda: ode.PIDController(rtol=1e-5, atol=1e-5, icoeff=float("nan")),
        ValueError,
        r"PIDController\(icoeff=nan\): pass a finite number",
    ),
    "atol of a shape that does not broadcast against y0": (
        lambda: solve(stepsize_controller=ode.PIDController(rtol=1e-5, atol=jnp.ones(3) * 1e-5)),
        ValueError,
        r"PIDController\(atol=...\) has shape \(3,\), .* y0 of shape \(2,\)",
    ),
    "an event root finder without tolerances": (
        lambda: ode.Event(lambda t, y, args, **kwargs: y[0] - 0.5, root_finder="x"),
        TypeError,
        r"Event\(root_finder='x'\): pass a root finder with rtol and atol",
    ),
    "a NaN root-finder tolerance": (
        lambda: ode.Kvaerno5(root_finder=ode.VeryChord(rtol=float("nan"), atol=1e-6)),
        ValueError,
        r"VeryChord\(rtol=nan\): pass a finite number >= 0",
    ),
    "negative root-finder tolerances": (
        lambda: ode.VeryChord(rtol=-1.0, atol=-1.0),
        ValueError,
        r"VeryChord\(rtol=-1.0\): pass a finite number >= 0",
    ),
    "a vector field that is not callable": (
        lambda: ode.ODETerm(jnp.zeros(2)),
        TypeError,
        r"ODETerm\(vector_field=Array.*\): pass a function f\(t, y, args\)",
    ),
    "a vector field whose output does not broadcast to y0": (
        lambda: solve(terms=ode.ODETerm(lambda t, y, args: jnp.zeros(3))),
        ValueError,
        r"output does not match y0: .* shapes \[\(3,\)\].* y0 has .* shapes \[\(2,\)\]",
    ),
    "y0 that is not an array": (
        lambda: solve(y0=object()),
        TypeError,
        r"y0 = <object object .*> \(type object\) is not an array",
    ),
    "max_steps given as a bool": (
        lambda: solve(max_steps=True),
        ValueError,
        r"max_steps=True: pass a positive int",
    ),
    "made_jump given as a string": (
        lambda: solve(made_jump="x"),
        TypeError,
        r"made_jump='x': pass a boolean scalar",
    ),
    "save times given as an empty list alone": (
        lambda: ode.SaveAt(ts=[]),
        ValueError,
        r"SaveAt\(ts=\[\]\) saves nothing",
    ),
    "unsorted interpolation knots": (
        lambda: ode.LinearInterpolation(jnp.array([0, 0.5, 0.2, 1]), jnp.zeros((4, 2))),
        ValueError,
        r"LinearInterpolation\(ts=...\) has ts\[2\]=0.2.*finite and increasing",
    ),
    "a single interpolation knot": (
        lambda: ode.LinearInterpolation(jnp.array([0.0]), jnp.zeros((1, 2))),
        ValueError,
        r"LinearInterpolation\(ts=...\) has 1 knot\(s\): pass at least two",
    ),
    "rectilinear data of another length than its times": (
        lambda: ode.rectilinear_interpolation(jnp.linspace(0, 1, 3), jnp.zeros((5, 2))),
        ValueError,
        r"ys has shape \(5, 2\) for 3 times",
    ),
    "Hermite data of another length than its times": (
        lambda: ode.backward_hermite_coefficients(jnp.linspace(0, 1, 3), jnp.zeros((5, 2))),
        ValueError,
        r"ys has shape \(5, 2\) for 3 times",
    ),
    "cubic coefficients that are not four": (
        lambda: ode.CubicInterpolation(jnp.linspace(0, 1, 3), (jnp.zeros((2, 1)),) * 3),
        ValueError,
        r"CubicInterpolation\(coeffs=...\): pass the 4-tuple \(d, c, b, a\)",
    ),
    "a negative steady-state tolerance": (
        lambda: ode.SteadyStateEvent(rtol=-1.0, atol=1e-6),
        ValueError,
        r"SteadyStateEvent\(rtol=-1.0\): pass a finite number >= 0",
    ),
    "a NaN steady-state tolerance": (
        lambda: ode.steady_state_event(rtol=float("nan"), atol=1e-6),
        ValueError,
        r"steady_state_event\(rtol=nan\)",
    ),
    "a dense solution evaluated at a string": (
        lambda: solve(saveat=ode.SaveAt(dense=True)).evaluate("0.5"),
        TypeError,
        r"sol.evaluate\(t0='0.5'\): pass a real time, or a 1-D array of times",
    ),
    "a manual step with made_jump a string": (
        lambda: ode.Tsit5().step(TERM, 0.0, 0.1, Y0, None, None, "x"),
        TypeError,
        r"solver.step\(made_jump='x'\): pass a boolean scalar",
    ),
    "a manual step with y0 a string": (
        lambda: ode.Tsit5().step(TERM, 0.0, 0.1, "y", None, None, False),
        TypeError,
        r"solver.step: y0 = 'y' \(type str\) is not an array",
    ),
    "a manual step with another solver's state": (
        lambda: ode.Tsit5().step(TERM, 0.0, 0.1, Y0, None, (1, 2, 3), False),
        ValueError,
        r"solver_state=\(1, 2, 3\) is not the state this solver carries",
    ),
    "t0 None": (lambda: solve(t0=None), TypeError, r"t0=None: pass a real number"),
    "t1 None": (lambda: solve(t1=None), TypeError, r"t1=None: pass a real number"),
    "throw a string": (lambda: solve(throw="yes"), TypeError, r"throw='yes': pass True or False"),
    "throw None": (lambda: solve(throw=None), TypeError, r"throw=None: pass True or False"),
    "throw traced": (
        lambda: jax.jit(lambda flag: solve(throw=flag).ys)(True),
        TypeError,
        r"throw=.* is a traced value: pass a Python bool",
    ),
    "a SaveAt flag a string": (
        lambda: ode.SaveAt(t1="yes"),
        TypeError,
        r"SaveAt\(t1='yes'\): pass True or False",
    ),
    "a SaveAt flag traced": (
        lambda: jax.jit(lambda d: solve(saveat=ode.SaveAt(t1=True, dense=d)).ys)(True),
        TypeError,
        r"SaveAt\(dense=.*\) is a traced value",
    ),
    "a SubSaveAt flag a string": (
        lambda: ode.SubSaveAt(t0="no", t1=True),
        TypeError,
        r"SubSaveAt\(t0='no'\): pass True or False",
    ),
    "PIDController rtol None": (
        lambda: ode.PIDController(rtol=None, atol=1e-6),
        TypeError,
        r"PIDController\(rtol=None\): pass a tolerance",
    ),
    "PIDController atol inf": (
        lambda: ode.PIDController(rtol=1e-6, atol=float("inf")),
        ValueError,
        r"PIDController\(atol=inf\) turns off error control",
    ),
    "HalfSolver of a string": (
        lambda: ode.HalfSolver("x"),
        TypeError,
        r"HalfSolver\(solver='x'\): pass a solver",
    ),
    "HalfSolver of a class": (
        lambda: ode.HalfSolver(ode.Euler),
        TypeError,
        r"HalfSolver\(solver=Euler\) is a class: pass an instance",
    ),
    "StepTo times as strings": (
        lambda: ode.StepTo(ts=["0", "1"]),
        TypeError,
        r"StepTo\(ts\): pass real times",
    ),
    "a dense solution evaluated at None": (
        lambda: solve(saveat=ode.SaveAt(dense=True)).evaluate(None),
        TypeError,
        r"sol.evaluate\(t0=None\): pass a real time",
    ),
    "y0 None for a field that uses its state": (
        lambda: solve(y0=None),
        TypeError,
        r"y0=None holds no arrays, and the vector field .* failed on it.* Pass the initial state",
    ),
    "y0 a Python list inside jit": (
        lambda: eqx.filter_jit(lambda y: solve(y0=y).ys)([1.0, 2.0]),
        TypeError,
        r"y0 is a Python list of 2 numbers.* y0=jnp.array\(\[\.\.\., \.\.\.\]\)",
    ),
    "a field returning a string": (
        lambda: solve(terms=ode.ODETerm(lambda t, y, args: "dy")),
        TypeError,
        r"the vector field returned a value of type str, not an array: .* shaped like y0",
    ),
    "an implicit solver with a field JAX cannot differentiate": (
        lambda: solve(
            terms=ode.ODETerm(
                lambda t, y, args: jax.pure_callback(
                    lambda y: -np.asarray(y), jax.ShapeDtypeStruct(y.shape, y.dtype), y
                )
            ),
            solver=ode.Kvaerno5(),
            dt0=None,
            stepsize_controller=PID,
        ),
        TypeError,
        r"Newton iterations take df/dy .* jax.custom_jvp\), pass the solver jacobian=",
    ),
    "a tolerance given as a string to VeryChord": (
        lambda: ode.VeryChord(rtol="a", atol=1e-6),
        TypeError,
        r"VeryChord\(rtol='a'\): pass a number",
    ),
    "an implicit solver's jacobian not a function": (
        lambda: ode.Kvaerno5(jacobian=jnp.eye(2)),
        TypeError,
        r"Kvaerno5\(jacobian=...\) is a .*, not a function",
    ),
    "PIDController error_order a string": (
        lambda: ode.PIDController(rtol=1e-6, atol=1e-6, error_order="x"),
        TypeError,
        r"PIDController\(error_order='x'\): pass a number",
    ),
    "PIDController error_order zero (the exponents divide by it)": (
        lambda: ode.PIDController(rtol=1e-6, atol=1e-6, error_order=0),
        ValueError,
        r"PIDController\(error_order=0\): pass a positive number",
    ),
    "PIDController force_dtmin a string (always truthy)": (
        lambda: ode.PIDController(rtol=1e-6, atol=1e-6, force_dtmin="False"),
        TypeError,
        r"PIDController\(force_dtmin='False'\): pass True or False",
    ),
    "PIDController rtol a list": (
        lambda: ode.PIDController(rtol=[1e-6, 1e-6], atol=1e-6),
        TypeError,
        r"PIDController\(rtol=\[1e-06, 1e-06\]\): pass a number, or an array",
    ),
    "TextProgressMeter minimum_increase negative": (
        lambda: ode.TextProgressMeter(minimum_increase=-1.0),
        ValueError,
        r"TextProgressMeter\(minimum_increase=-1.0\): .* in \(0, 1\]",
    ),
    "BacksolveAdjoint solver a name": (
        lambda: ode.BacksolveAdjoint(solver="tsit5"),
        TypeError,
        r"BacksolveAdjoint\(solver='tsit5'\): pass an instance \(e.g. Tsit5\(\)\)",
    ),
    "solver.step to a NaN time": (
        lambda: ode.Tsit5().step(
            TERM, 0.0, jnp.nan, Y0, None, ode.Tsit5().init(TERM, 0.0, 0.1, Y0, None), False
        ),
        ValueError,
        r"solver.step\(t1=nan\): pass a finite time",
    ),
    "StepTo times out of order, shown": (
        lambda: solve(dt0=None, stepsize_controller=ode.StepTo(ts=jnp.array([0.0, 0.7, 0.3, 1.0]))),
        ode.InvalidStepTimes,
        r"got ts\[1\]=0.7 then ts\[2\]=0.3",
    ),
    "backward_hermite_coefficients times out of order, shown": (
        lambda: ode.backward_hermite_coefficients(jnp.array([0.0, 0.6, 0.3, 1.0]), jnp.zeros(4)),
        ValueError,
        r"backward_hermite_coefficients\(ts=...\) has ts\[1\]=0.6 then ts\[2\]=0.3",
    ),
    "backward_hermite_coefficients deriv0 of another shape": (
        lambda: ode.backward_hermite_coefficients(
            jnp.linspace(0, 1, 4), jnp.zeros((4, 2)), deriv0=jnp.zeros(3)
        ),
        ValueError,
        r"deriv0=...\) has shape \(3,\) where one row of ys has \(2,\)",
    ),
    "a field branching on its state with a Python if": (
        lambda: solve(terms=ode.ODETerm(lambda t, y, args: -y if y[0] > 0 else y)),
        TypeError,
        r"reads the value of an array it is given .* jnp.where",
    ),
    "a field returning a comparison": (
        lambda: solve(terms=ode.ODETerm(lambda t, y, args: y > 0)),
        TypeError,
        r"returned a boolean array",
    ),
    "an event condition that is NaN": (
        lambda: solve(t1=5.0, event=ode.Event(lambda t, y, args, **kw: jnp.nan * y[0])),
        ode.SolveError,
        r"nonfinite_event_condition",
    ),
    "a MultiTerm whose rates do not add up": (
        lambda: solve(terms=ode.MultiTerm(TERM, ode.ODETerm(lambda t, y, args: jnp.ones(3)))),
        ValueError,
        r"MultiTerm: .*terms\[0\]: \(2,\); terms\[1\]: \(3,\); y0: \(2,\)",
    ),
    "a vmapped dense solution evaluated outside vmap": (
        lambda: jax.vmap(lambda y: solve(y0=y, saveat=ode.SaveAt(dense=True)))(
            jnp.ones((3, 2))
        ).evaluate(0.5),
        ValueError,
        r"sol.evaluate: this solution holds \(3,\) solutions .* jax.vmap\(lambda sol",
    ),
    "ControlTerm without a control": (
        lambda: ode.ControlTerm(lambda t, y, args: y, None),
        TypeError,
        r"ControlTerm\(control=None\): pass a path",
    ),
    "t0 a NumPy string array": (
        lambda: solve(t0=np.array("0")),
        TypeError,
        r"t0=array\('0', dtype='<U1'\): pass a real number",
    ),
    "y0 a NumPy object array": (
        lambda: solve(y0=np.array([1.0, None], dtype=object)),
        TypeError,
        r"y0 = array\(\[1.0, None\], dtype=object\) .* every leaf of y0 must be a float",
    ),
    "y0 a PRNG key": (
        lambda: solve(y0=jax.random.key(0)),
        TypeError,
        r"(?s)y0 = .*key<fry>.* every leaf of y0 must be a float",
    ),
    # A negative tolerance accepts every step: per component, at construction or at run
    # time, as a scalar is.
    "negative atol per component": (
        lambda: ode.PIDController(rtol=1e-6, atol=jnp.array([1e-6, -1.0])),
        ValueError,
        r"atol=array with atol\[1\]=-1.0\): each tolerance must be finite and >= 0",
    ),
    "NaN rtol per component": (
        lambda: ode.PIDController(rtol=np.array([1e-6, np.nan]), atol=1e-6),
        ValueError,
        r"rtol=array with rtol\[1\]=nan",
    ),
    "complex rtol": (
        lambda: ode.PIDController(rtol=1e-6 + 1e-6j, atol=1e-6),
        TypeError,
        r"rtol=\(1e-06\+1e-06j\)\): pass a real tolerance",
    ),
    "traced negative rtol": (
        lambda: jitted(
            lambda r: dict(dt0=None, stepsize_controller=ode.PIDController(rtol=r, atol=0.0)),
            -0.5,
        ),
        RUN_TIME,
        r"invalid_tolerances.*finite and >= 0",
    ),
    "traced NaN atol per component": (
        lambda: jitted(
            lambda a: dict(dt0=None, stepsize_controller=ode.PIDController(rtol=1e-6, atol=a)),
            [1e-6, jnp.nan],
        ),
        RUN_TIME,
        r"invalid_tolerances",
    ),
    "a row per step for more steps than can be counted": (
        lambda: solve(
            saveat=ode.SaveAt(steps=True), dt0=None, stepsize_controller=PID, max_steps=2**40
        ),
        ValueError,
        r"SaveAt\(steps=True\) keeps a row for each step .* max_steps=1099511627776",
    ),
    "a time given as a string to solver.step": (
        lambda: ode.Tsit5().step(TERM, "0", 1.0, Y0, None, None, made_jump=False),
        TypeError,
        r"solver.step\(t0='0'\): pass a real number",
    ),
    "a root finder class rather than an instance": (
        lambda: solve(
            solver=ode.Kvaerno5(root_finder=ode.VeryChord), dt0=None, stepsize_controller=PID
        ),
        TypeError,
        r"root_finder=VeryChord is a class: pass an instance",
    ),
    "a schedule of no checkpoints": (
        lambda: ode.Online(checkpoints=0),
        ValueError,
        r"Online\(checkpoints=0\): pass 1 states or more",
    ),
    "segments of no ticks": (
        lambda: ode.Segments(length=0),
        ValueError,
        r"Segments\(length=0\): pass 1 ticks or more",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input(case):
    make, error, words = CASES[case]
    with pytest.raises(error, match=words):
        make()


# ---------------------------------------------------------------- edge inputs that solve


def test_an_empty_state_solves_with_an_adaptive_controller():
    sol = solve(y0=jnp.zeros(0), dt0=None, stepsize_controller=PID)
    assert sol.ys.shape == (1, 0)
    assert sol.result == ode.RESULTS.successful


def test_a_float16_state_solves_with_an_adaptive_controller():
    controller = ode.PIDController(rtol=1e-3, atol=1e-3)
    sol = solve(y0=jnp.array([1.0], jnp.float16), dt0=None, stepsize_controller=controller)
    assert sol.ys.dtype == jnp.float16
    np.testing.assert_allclose(np.float64(sol.ys[-1, 0]), np.exp(-1.0), rtol=2e-3)


def test_a_dt0_just_above_the_resolution_of_time_solves():
    # 2.5 spacings of float32 near 1e5: steps of 2 or 3 ulps, and no sliver absorbed
    # into a long last step (100 ulps were, before: a 78x dt0 step).
    t0, t1 = jnp.float32(99999), jnp.float32(1e5)
    dt0 = jnp.float32(2.5 * np.spacing(np.float32(1e5)))
    y0 = jnp.array([1.0], jnp.float32)
    sol = solve(solver=ode.Euler(), t0=t0, t1=t1, dt0=dt0, y0=y0, max_steps=None)
    np.testing.assert_allclose(sol.ys[-1, 0], np.exp(-1.0), rtol=2e-2)


def test_an_adaptive_first_step_is_checked_against_the_times_near_t0_only():
    # float32 times near 1e4 are 1e-3 apart, but an adaptive solve takes dt0 once, at
    # t0 = 0, and grows its steps (as Diffrax's stiff Robertson setup does to t1 = 1e4).
    y0 = jnp.array([1.0], jnp.float32)
    pid = ode.PIDController(rtol=1e-4, atol=1e-6)
    sol = solve(terms=ode.ODETerm(lambda t, y, args: -y / (1 + t)), t1=1e4, dt0=1e-3, y0=y0,
                stepsize_controller=pid)  # fmt: skip
    np.testing.assert_allclose(sol.ys[-1, 0], 1 / (1 + 1e4), rtol=1e-2)
    # Steps of dt0 all the way to t1 cannot be taken there: the fix named is not a shift.
    with pytest.raises(ValueError, match=r"near t=10000.*use an adaptive controller"):
        solve(solver=ode.Euler(), t1=1e4, dt0=1e-4, y0=y0, max_steps=None)


def test_float32_save_times_of_a_float64_solve_end_at_t1():
    # float32(0.3) is 0.30000001 in float64: within its own dtype's rounding of t1=0.3,
    # so it is saved at t1 (as Diffrax accepts it) rather than refused as outside.
    ts = jnp.linspace(0.0, 0.3, 4, dtype=jnp.float32)
    at_ts = lambda ts: dict(t1=0.3, saveat=ode.SaveAt(ts=ts))
    for ys in (solve(**at_ts(ts)).ys, jitted(at_ts, ts)):
        np.testing.assert_allclose(ys[:, 0], np.exp(-np.asarray(ts, np.float64)), rtol=1e-6)
    with pytest.raises(ValueError, match=r"ts\[1\]=0.31.* outside \[t0, t1\] = \[0.0, 0.3\]"):
        solve(**at_ts(jnp.array([0.1, 0.31], jnp.float32)))


def test_a_python_int_state_beyond_int32_solves():
    sol = solve(y0=2**40)
    np.testing.assert_allclose(sol.ys[-1], 2.0**40 * np.exp(-1.0), rtol=1e-5)


def test_a_diffrax_term_is_named_as_not_mixing():
    diffrax = pytest.importorskip("diffrax")
    with pytest.raises(ode.TermAndSolverIncompatible, match=r"A diffrax term does not mix"):
        solve(terms=diffrax.ODETerm(lambda t, y, args: -y))


@pytest.mark.parametrize("max_steps", [2**31, 2**32 + 3, 2**40])
def test_max_steps_beyond_int32_solves(max_steps):
    sol = solve(dt0=None, stepsize_controller=PID, max_steps=max_steps)
    np.testing.assert_allclose(sol.ys[-1], np.exp(-1.0) * np.array([1.0, 2.0]), rtol=1e-6)
    assert sol.stats["max_steps"] == max_steps


def test_reverse_mode_memory_follows_the_steps_not_max_steps():
    def loss(y0, max_steps):
        sol = solve(y0=y0, dt0=None, stepsize_controller=PID, max_steps=max_steps)
        return jnp.sum(sol.ys[-1])

    def temp_bytes(max_steps):
        grad = jax.jit(jax.grad(loss), static_argnums=1)
        compiled = grad.lower(jnp.array([1.0, 2.0]), max_steps).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    # A 9-step solve: the same memory for a bound of 1e6 as for 1e9.
    assert temp_bytes(10**9) <= temp_bytes(10**6) < 16 * 2**20


@pytest.mark.parametrize("schedule", ["online", pytest.param("segments", marks=pytest.mark.matrix)])
def test_a_solve_longer_than_the_decision_record_differentiates_exactly(schedule):
    # Step-size decisions are kept for the first `decision_rows` ticks; later ones are
    # made again when recomputed. Shrunk to 4 here so that a 30-step solve goes past it.

    def loss(p, adjoint):
        field = lambda t, y, args: -args * y + jnp.sin(3 * t)
        sol = solve(
            terms=ode.ODETerm(field), y0=jnp.array([1.0, 2.0]), args=p, dt0=None,
            stepsize_controller=PID, adjoint=adjoint,
        )  # fmt: skip
        return jnp.sum(sol.ys[-1])

    recomputing = ode.RecursiveCheckpointAdjoint(checkpoints=3, schedule=schedule, decision_rows=4)
    grad = jax.grad(loss)(1.5, recomputing)
    np.testing.assert_allclose(grad, jax.grad(loss)(1.5, ode.DirectAdjoint()), rtol=1e-10)


@pytest.mark.parametrize(
    "adjoint, saveat, refused",
    [
        (ode.BacksolveAdjoint(), ode.SaveAt(t1=True, controller_state=True), "controller_state"),
        (ode.ImplicitAdjoint(), ode.SaveAt(t1=True, dense=True), "dense"),
    ],
)
def test_an_adjoint_refuses_the_outputs_it_does_not_differentiate(adjoint, saveat, refused):
    # Each lists the SaveAt options it differentiates; any other is named and refused.
    with pytest.raises(ValueError, match=rf"(?s)saveat=SaveAt\(.*not {refused}:"):
        solve(saveat=saveat, adjoint=adjoint)


@pytest.mark.parametrize(
    "argument, value",
    [("memory_budget", v) for v in (-1, 0, 2.5, True, "4 MiB")]
    + [("decision_rows", v) for v in (-1, 1.5, False)]
    + [("checkpoints", v) for v in (0, 2.0, True)],
)
def test_the_checkpointing_adjoints_numbers_are_checked(argument, value):
    # Each names the argument and its value, at construction, not deep in a solve.
    with pytest.raises((TypeError, ValueError), match=rf"\({argument}={value!r}\): pass"):
        ode.RecursiveCheckpointAdjoint(**{argument: value})


def test_backsolve_takes_a_seminorm_flag():
    with pytest.raises(TypeError, match=r"BacksolveAdjoint\(seminorm='yes'\): pass True"):
        ode.BacksolveAdjoint(seminorm="yes")


def test_a_schedule_is_given_as_an_object_or_its_name():
    with pytest.raises(ValueError, match=r"schedule=3\): pass a schedule \(Tape\(\)"):
        ode.RecursiveCheckpointAdjoint(schedule=3)
    named = ode.RecursiveCheckpointAdjoint(schedule="revolve").chosen_schedule()
    assert named == ode.Revolve()
    given = ode.Revolve(checkpoints=8)
    assert ode.RecursiveCheckpointAdjoint(schedule=given).chosen_schedule() is given
