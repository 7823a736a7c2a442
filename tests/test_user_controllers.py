"""Step-size controllers written in Diffrax's interface (`wrap`, `init`,
`adapt_step_size`) run in `diffeqsolve`, alone and inside `ClipStepSizeController`, and
agree with Diffrax running the same class: the same steps, the same solution, the same
gradient (which, as Diffrax's, follows the controller's step sizes). Each controller is
written once, for either library (`lib`)."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import odesolve as ode

jax.config.update("jax_enable_x64", True)


def integral_controller(lib):
    """An integral controller on the RMS norm, choosing its first step from the field
    (through `func`) when `dt0` is None, as a user would write it for Diffrax."""

    class Integral(lib.AbstractAdaptiveStepSizeController):
        rtol: float
        atol: float
        norm: object = staticmethod(lambda x: jnp.sqrt(jnp.mean(x**2)))  # Diffrax asks one

        def wrap(self, direction):
            return self

        def init(self, terms, t0, t1, y0, dt0, args, func, error_order):
            if dt0 is None:
                f0 = func(terms, t0, y0, args)
                scale = self.atol + self.rtol * jnp.abs(y0)
                dt0 = 0.01 * self.norm(y0 / scale) / self.norm(f0 / scale)
            return t0 + dt0, dt0

        def adapt_step_size(
            self, t0, t1, y0, y1_candidate, args, y_error, error_order, controller_state
        ):
            scale = self.atol + self.rtol * jnp.maximum(jnp.abs(y0), jnp.abs(y1_candidate))
            error = self.norm(y_error / scale)
            keep = error <= 1
            factor = jnp.clip(0.9 * error ** (-1.0 / error_order), 0.2, 10.0)
            dt = (t1 - t0) * factor
            next_t0 = jnp.where(keep, t1, t0)
            return keep, next_t0, next_t0 + dt, False, dt, lib.RESULTS.successful

    return Integral(rtol=1e-6, atol=1e-8)


def jump_controller(lib):
    """Fixed steps of 0.07 that stop at t = 0.5, where the field jumps, and restart just
    after it, saying so with `made_jump` (as Diffrax's PID does for `jump_ts`)."""

    class StepsToJump(lib.AbstractStepSizeController):
        def wrap(self, direction):
            return self

        def init(self, terms, t0, t1, y0, dt0, args, func, error_order):
            return jnp.minimum(t0 + 0.07, 0.5), None

        def adapt_step_size(
            self, t0, t1, y0, y1_candidate, args, y_error, error_order, controller_state
        ):
            at_jump = t1 == 0.5
            next_t0 = jnp.where(at_jump, jnp.nextafter(t1, jnp.inf), t1)
            end = next_t0 + 0.07
            end = jnp.where((next_t0 < 0.5) & (end > 0.5), 0.5, end)
            return True, next_t0, end, at_jump, controller_state, lib.RESULTS.successful

    return StepsToJump()


def lotka_volterra(t, y, args):
    a, b, c = args
    return jnp.stack([a * y[0] - b * y[0] * y[1], b * y[0] * y[1] - c * y[1]])


ARGS = jnp.array([1.5, 1.0, 3.0])
TS = jnp.linspace(0.0, 3.0, 7)


def _solve(lib, controller, *, solver="Tsit5", t0=0.0, t1=3.0, dt0=None, args=ARGS, y0=None, **kw):
    return lib.diffeqsolve(
        lib.ODETerm(lotka_volterra),
        getattr(lib, solver)(),
        t0,
        t1,
        dt0,
        jnp.array([1.0, 1.0]) if y0 is None else y0,
        args,
        stepsize_controller=controller,
        max_steps=10_000,
        **kw,
    )


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(dict(), id="first-step-from-func"),
        pytest.param(
            dict(solver="Dopri5", dt0=0.1, saveat="ts"), id="save-times", marks=pytest.mark.matrix
        ),
        pytest.param(dict(t0=3.0, t1=0.0, dt0=-0.1), id="backwards", marks=pytest.mark.matrix),
        pytest.param(dict(clip=True, saveat="steps"), id="clipped", marks=pytest.mark.matrix),
    ],
)
def test_same_steps_and_solution_as_diffrax(case):
    case = dict(case)
    clip, saveat = case.pop("clip", False), case.pop("saveat", None)

    def run(lib):
        controller = integral_controller(lib)
        if clip:
            controller = lib.ClipStepSizeController(controller, step_ts=jnp.array([0.5, 1.25]))
        save = {"ts": lib.SaveAt(ts=TS), "steps": lib.SaveAt(steps=True)}.get(saveat)
        return _solve(lib, controller, **case, **({} if save is None else dict(saveat=save)))

    ours, theirs = run(ode), run(diffrax)
    assert int(ours.stats["num_steps"]) == int(theirs.stats["num_steps"])
    finite = lambda sol: np.asarray(sol.ys)[np.isfinite(np.asarray(sol.ys)[:, 0])]
    np.testing.assert_allclose(finite(ours), finite(theirs), rtol=1e-9, atol=1e-12)
    if clip:  # the clipped steps land on the step times
        assert {0.5, 1.25} <= set(np.asarray(ours.ts).tolist())


def _gradient_loss(lib, **options):
    def loss(args, y0=None):
        controller = integral_controller(lib)
        sol = _solve(
            lib, controller, dt0=0.1, args=args, y0=y0, saveat=lib.SaveAt(ts=TS), **options
        )
        return jnp.sum(sol.ys)

    return loss


def test_gradient_follows_the_controllers_step_sizes():
    """A user's controller may differentiate its step sizes (this one does: its factor
    reads the error estimate): the gradient is that of the computed solution, step
    placement included, as central differences of the solve say."""
    value = jax.jit(_gradient_loss(ode))
    got = jax.jit(jax.grad(_gradient_loss(ode)))(ARGS)
    h = 1e-6
    fd = [(value(ARGS + h * e) - value(ARGS - h * e)) / (2 * h) for e in np.eye(3)]
    np.testing.assert_allclose(got, fd, rtol=1e-6)


@pytest.mark.matrix
def test_gradient_as_diffraxs():
    got = jax.jit(jax.grad(_gradient_loss(ode)))(ARGS)
    np.testing.assert_allclose(got, jax.grad(_gradient_loss(diffrax))(ARGS), rtol=1e-10)


@pytest.mark.matrix
def test_under_vmap():
    def run(lib):
        return jax.vmap(
            lambda y0: (
                lib.diffeqsolve(
                    lib.ODETerm(lotka_volterra),
                    lib.Tsit5(),
                    0.0,
                    3.0,
                    0.1,
                    y0,
                    ARGS,
                    stepsize_controller=integral_controller(lib),
                ).ys
            )
        )(jnp.array([[1.0, 1.0], [2.0, 0.5]]))

    np.testing.assert_allclose(run(ode), run(diffrax), rtol=1e-10)


@pytest.mark.parametrize("solver", ["Tsit5", pytest.param("Euler", marks=pytest.mark.matrix)])
def test_a_jump_it_marks_restarts_the_solver(solver):
    """`made_jump=True` makes the next step start afresh past the jump: a first-same-as-
    last solver evaluates the field there again, as in Diffrax."""
    field = lambda t, y, args: -y + jnp.where(t > 0.5, 5.0, 0.0)

    def run(lib):
        return lib.diffeqsolve(
            lib.ODETerm(field),
            getattr(lib, solver)(),
            0.0,
            1.0,
            None,
            jnp.ones(2),
            stepsize_controller=jump_controller(lib),
            saveat=lib.SaveAt(ts=jnp.linspace(0.0, 1.0, 5)),
        ).ys

    np.testing.assert_allclose(run(ode), run(diffrax), rtol=1e-12)
    if solver == "Tsit5":  # y(1) = 5 + (exp(-1/2) - 5) exp(-1/2)
        exact = 5 + (np.exp(-0.5) - 5) * np.exp(-0.5)
        np.testing.assert_allclose(run(ode)[-1], exact, rtol=1e-4)


def test_without_an_error_estimate():
    """A controller that is not adaptive gets `y_error=None` from a solver without an
    estimate; an adaptive one is refused there, named."""

    class Halving(ode.AbstractStepSizeController):
        def wrap(self, direction):
            return self

        def init(self, terms, t0, t1, y0, dt0, args, func, error_order):
            return t0 + dt0, dt0

        def adapt_step_size(self, t0, t1, y0, y1, args, y_error, error_order, state):
            assert y_error is None
            return True, t1, t1 + state, False, state, ode.RESULTS.successful

    term = ode.ODETerm(lambda t, y, args: -y)
    sol = ode.diffeqsolve(
        term, ode.Euler(), 0.0, 1.0, 0.1, jnp.ones(2), stepsize_controller=Halving()
    )
    np.testing.assert_allclose(sol.ys[-1], 0.9**10, rtol=1e-12)
    with pytest.raises(
        ValueError, match="Euler has no error estimate, so it cannot be used with Integral"
    ):
        ode.diffeqsolve(
            term,
            ode.Euler(),
            0.0,
            1.0,
            0.1,
            jnp.ones(2),
            stepsize_controller=integral_controller(ode),
        )


def test_an_unwritten_method_is_named():
    class NoAdapt(ode.AbstractStepSizeController):
        def wrap(self, direction):
            return self

        def init(self, terms, t0, t1, y0, dt0, args, func, error_order):
            return t0 + dt0, None

    with pytest.raises(TypeError, match="abstract method adapt_step_size"):
        NoAdapt()


@pytest.mark.matrix
def test_gradient_in_every_order():
    """The step-size path differentiated under each transformation as users write it,
    against the default adjoint's gradient one sample at a time."""
    batch = jnp.stack([ARGS, ARGS * jnp.array([1.1, 0.9, 1.05])])
    default = _gradient_loss(ode, adjoint=ode.RecursiveCheckpointAdjoint())
    forward = _gradient_loss(ode, adjoint=ode.ForwardMode())
    want = np.stack([jax.grad(default)(a) for a in batch])
    jvp = jax.jit(lambda a, v: jax.jvp(forward, (a,), (v,))[1])
    orders = {
        "vmap(grad)": lambda: jax.vmap(jax.grad(default))(batch),
        "grad(vmap)": lambda: jax.grad(lambda b: jnp.sum(jax.vmap(default)(b)))(batch),
        "jacfwd forward mode": lambda: jax.vmap(jax.jacfwd(forward))(batch),
        "direct": lambda: jax.vmap(jax.grad(_gradient_loss(ode, adjoint=ode.DirectAdjoint())))(
            batch
        ),
        "jit(vmap(grad))": lambda: jax.jit(jax.vmap(jax.grad(default)))(batch),
        "vmap(vmap(grad))": lambda: jax.vmap(jax.vmap(jax.grad(default)))(batch[None])[0],
        # Sample i's loss by its own parameters: the Jacobian's diagonal blocks.
        "jacrev(vmap)": lambda: jax.jacrev(jax.vmap(default))(batch)[jnp.arange(2), jnp.arange(2)],
        "jit(jvp) forward mode": lambda: jnp.array(
            [[jvp(a, e) for e in jnp.eye(3)] for a in batch]
        ),
    }
    for name, run in orders.items():
        np.testing.assert_allclose(run(), want, rtol=1e-9, err_msg=name)

    # vmap(grad) with the parameters shared and the initial states batched.
    y0s = jnp.array([[1.0, 1.0], [2.0, 0.5]])
    shared = jax.vmap(jax.grad(default), in_axes=(None, 0))(ARGS, y0s)
    one_by_one = np.stack([jax.grad(default)(ARGS, y0) for y0 in y0s])
    np.testing.assert_allclose(shared, one_by_one, rtol=1e-9, err_msg="vmap(grad) shared")
