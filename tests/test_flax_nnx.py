"""A Flax NNX module as the vector field: it solves, differentiates and trains.

NNX modules (flax >= 0.12) are pytrees, so one can be passed to `ODETerm` as it is; its
parameters are then inputs of the solve like an equinox module's. The split/merge idiom
(`nnx.split` to a graph definition and a state of arrays, `nnx.merge` inside the loss)
works too and is what older flax versions need. Gradients are checked against the same
network written as a pure function of a dict of arrays.
"""

import jax
import jax.numpy as jnp
import pytest

import odesolve as ode

nnx = pytest.importorskip("flax.nnx")
optax = pytest.importorskip("optax")

TS = jnp.linspace(0.0, 2.0, 9)
Y0 = jnp.array([1.0, -0.5])


class Field(nnx.Module):
    """dy/dt = W2 tanh(W1 y + b1) + b2, a two-layer NNX network."""

    def __init__(self, rngs):
        self.hidden = nnx.Linear(2, 16, rngs=rngs, param_dtype=jnp.float64)
        self.out = nnx.Linear(16, 2, rngs=rngs, param_dtype=jnp.float64)

    def __call__(self, t, y, args):
        return self.out(jnp.tanh(self.hidden(y)))


def pure_field(t, y, weights):
    """The same network as a function of plain arrays (the reference)."""
    hidden = jnp.tanh(y @ weights["hidden_kernel"] + weights["hidden_bias"])
    return hidden @ weights["out_kernel"] + weights["out_bias"]


def weights_of(field):
    return {
        "hidden_kernel": field.hidden.kernel[...],
        "hidden_bias": field.hidden.bias[...],
        "out_kernel": field.out.kernel[...],
        "out_bias": field.out.bias[...],
    }


def trajectory(vector_field, args=None, adjoint=ode.RecursiveCheckpointAdjoint()):
    sol = ode.diffeqsolve(
        ode.ODETerm(vector_field),
        ode.Tsit5(),
        t0=TS[0],
        t1=TS[-1],
        dt0=0.1,
        y0=Y0,
        args=args,
        saveat=ode.SaveAt(ts=TS),
        stepsize_controller=ode.PIDController(rtol=1e-9, atol=1e-9),
        adjoint=adjoint,
    )
    return sol.ys


def objective(ys):
    return jnp.sum(jnp.sin(ys))


def test_module_solves_like_the_pure_function():
    field = Field(nnx.Rngs(0))
    ys = jax.jit(trajectory)(field)
    reference = trajectory(pure_field, weights_of(field))
    assert jnp.allclose(ys, reference, rtol=1e-12, atol=1e-12)
    assert not jnp.allclose(ys[-1], Y0)  # the field does move the state


@pytest.mark.parametrize(
    "adjoint",
    [ode.RecursiveCheckpointAdjoint(), pytest.param(ode.DirectAdjoint(), marks=pytest.mark.matrix)],
    ids=type,
)
def test_gradients_reach_the_module_parameters(adjoint):
    field = Field(nnx.Rngs(1))
    grads = nnx.grad(lambda f: objective(trajectory(f, adjoint=adjoint)))(field)
    reference = jax.grad(lambda w: objective(trajectory(pure_field, w, adjoint)))(weights_of(field))
    got = {
        "hidden_kernel": grads["hidden"]["kernel"][...],
        "hidden_bias": grads["hidden"]["bias"][...],
        "out_kernel": grads["out"]["kernel"][...],
        "out_bias": grads["out"]["bias"][...],
    }
    for name, value in reference.items():
        assert jnp.max(jnp.abs(value)) > 1e-3, name  # a gradient that is not trivially zero
        assert jnp.allclose(got[name], value, rtol=1e-9, atol=1e-12), name


def test_split_merge_idiom_gives_the_same_gradient():
    field = Field(nnx.Rngs(2))
    graphdef, params = nnx.split(field, nnx.Param)

    def loss(params):
        return objective(trajectory(nnx.merge(graphdef, params)))

    grads = jax.grad(loss)(params)
    direct = nnx.grad(lambda f: objective(trajectory(f)))(field)
    for path in (("hidden", "kernel"), ("out", "bias")):
        split_value = grads[path[0]][path[1]][...]
        direct_value = direct[path[0]][path[1]][...]
        assert jnp.allclose(split_value, direct_value, rtol=1e-12, atol=1e-14)


def test_module_trains_with_nnx_optimizer():
    """Fit the field to a target trajectory (a slow rotation) with nnx.Optimizer + Adam."""
    rotation = jnp.array([[0.0, 1.0], [-1.0, 0.0]])
    target = trajectory(lambda t, y, args: rotation @ y)
    field = Field(nnx.Rngs(3))
    optimizer = nnx.Optimizer(field, optax.adam(2e-2), wrt=nnx.Param)

    @nnx.jit
    def train_step(field, optimizer):
        loss, grads = nnx.value_and_grad(lambda f: jnp.mean((trajectory(f) - target) ** 2))(field)
        optimizer.update(field, grads)
        return loss

    # optax's Adam adds its int32 step count to floats, which strict promotion rejects.
    with jax.numpy_dtype_promotion("standard"):
        losses = [float(train_step(field, optimizer)) for _ in range(60)]
    assert losses[-1] < losses[0] / 10, (losses[0], losses[-1])
