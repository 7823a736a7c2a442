"""A solver inside a larger model: an ODE-block classifier, batched with vmap, trained with
optax, with the adjoint (and so the memory of the backward pass) chosen on the command line.

Data: two concentric rings in the plane (fixed PRNG key), labelled inner / outer. Model:
a linear lift R^2 -> R^8, an ODE block dh/dt = MLP(h) on t in [0, 1] (Tsit5, 10 fixed
steps), then a linear read-out to two logits. The per-example model is vmapped over each
minibatch; Adam minimises the cross-entropy.

The adjoint decides how the block is differentiated:
  --adjoint recursive [--checkpoints N | --memory-budget BYTES]   (default)
      RecursiveCheckpointAdjoint: exact. With N checkpoints, Griewank's binomial schedule
      recomputes steps to store only N states; with a byte budget it tapes every step when
      that fits and otherwise keeps as many states as fit.
  --adjoint direct      DirectAdjoint: exact, and also supports forward mode.
  --adjoint backsolve   BacksolveAdjoint: the continuous adjoint (approximate, O(1) memory).
The script prints the compiled training step's XLA temporary memory, so running it with
different choices shows the trade-off. The figure shows the loss and the decision regions.

    python examples/training_loop.py [--quick] [--adjoint recursive --checkpoints 3]
        [--memory-budget 1048576] [--out training_loop.png]
"""

import argparse
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import matplotlib
import optax

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import odesolve as ode  # noqa: E402

HIDDEN = 8


def rings(key, count: int):
    """`count` points: label 0 on radius 0.5-1.0, label 1 on radius 1.5-2.0."""
    angle_key, radius_key, label_key = jax.random.split(key, 3)
    labels = jax.random.bernoulli(label_key, 0.5, (count,)).astype(jnp.int32)
    radius = jax.random.uniform(radius_key, (count,), minval=0.5, maxval=1.0)
    radius = radius + labels.astype(radius.dtype)
    angle = jax.random.uniform(angle_key, (count,), maxval=2 * jnp.pi)
    return jnp.stack([radius * jnp.cos(angle), radius * jnp.sin(angle)], axis=-1), labels


def make_adjoint(name: str, checkpoints: int | None, memory_budget: int | None):
    """The adjoint named on the command line."""
    if name == "direct":
        return ode.DirectAdjoint()
    if name == "backsolve":
        return ode.BacksolveAdjoint()
    if memory_budget is not None:
        return ode.RecursiveCheckpointAdjoint(checkpoints=checkpoints, memory_budget=memory_budget)
    return ode.RecursiveCheckpointAdjoint(checkpoints=checkpoints)


class ODEBlock(eqx.Module):
    """h(1) from h(0) under dh/dt = MLP(h); the adjoint is a static choice."""

    field: eqx.nn.MLP
    adjoint: ode.AbstractAdjoint = eqx.field(static=True)

    def __call__(self, h):
        sol = ode.diffeqsolve(
            ode.ODETerm(lambda t, y, args: self.field(y)),
            ode.Tsit5(),
            t0=0.0,
            t1=1.0,
            dt0=0.1,
            y0=h,
            adjoint=self.adjoint,
            # 10 steps are taken; a tight bound keeps the backward pass's storage small.
            max_steps=16,
        )
        return sol.ys[-1]


class Classifier(eqx.Module):
    """Lift to R^HIDDEN, flow through the ODE block, read out two logits."""

    lift: eqx.nn.Linear
    block: ODEBlock
    readout: eqx.nn.Linear

    def __init__(self, adjoint, *, key):
        lift_key, field_key, readout_key = jax.random.split(key, 3)
        self.lift = eqx.nn.Linear(2, HIDDEN, key=lift_key)
        field = eqx.nn.MLP(HIDDEN, HIDDEN, 32, depth=1, activation=jnp.tanh, key=field_key)
        self.block = ODEBlock(field, adjoint)
        self.readout = eqx.nn.Linear(HIDDEN, 2, key=readout_key)

    def __call__(self, x):
        return self.readout(self.block(self.lift(x)))


def loss_fn(model, x, labels):
    """Mean cross-entropy of the vmapped model on a minibatch."""
    logits = jax.vmap(model)(x)
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))


@eqx.filter_jit
def _predict(model, x):
    return jax.vmap(model)(x)


def predict(model, x, chunk: int = 256):
    """Logits for x (n, 2) with n a multiple of `chunk`, in chunks of one compiled shape
    (XLA:CPU is slow to compile the block vmapped over a large grid at once)."""
    return jnp.concatenate([_predict(model, part) for part in jnp.split(x, x.shape[0] // chunk)])


def accuracy(model, x, labels) -> float:
    """Fraction of points classified correctly."""
    predicted = jnp.argmax(predict(model, x), axis=-1).astype(labels.dtype)
    return float(jnp.mean(predicted == labels))


def compile_train_step(model, optimizer, opt_state, x, labels):
    """Compile one Adam step ahead of time; returns it and its XLA temp memory (bytes)."""
    params, static = eqx.partition(model, eqx.is_inexact_array)

    def train_step(params, opt_state, x, labels):
        model = eqx.combine(params, static)
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, labels)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    compiled = jax.jit(train_step).lower(params, opt_state, x, labels).compile()
    memory = compiled.memory_analysis()
    return compiled, static, (memory.temp_size_in_bytes if memory is not None else None)


def train(model, x, labels, *, epochs: int, batch_size: int, key):
    """Minibatch Adam; returns the trained model, loss per step and the step's temp memory."""
    batches = x.shape[0] // batch_size
    # A large step early, annealed to zero: the loss of a small batch is noisy at the end.
    optimizer = optax.adam(optax.cosine_decay_schedule(3e-2, epochs * batches))
    params, _ = eqx.partition(model, eqx.is_inexact_array)
    opt_state = optimizer.init(params)
    step, static, temp_bytes = compile_train_step(
        model, optimizer, opt_state, x[:batch_size], labels[:batch_size]
    )
    losses = []
    for epoch in range(epochs):
        order = jax.random.permutation(jax.random.fold_in(key, epoch), x.shape[0])
        for b in range(batches):
            idx = order[b * batch_size : (b + 1) * batch_size]
            params, opt_state, loss = step(params, opt_state, x[idx], labels[idx])
            losses.append(float(loss))
        print(f"epoch {epoch:3d}  loss {losses[-1]:.4f}", flush=True)
    return eqx.combine(params, static), losses, temp_bytes


def plot(model, x, labels, losses, title: str, out: str) -> None:
    grid = jnp.linspace(-2.5, 2.5, 80, dtype=x.dtype)
    gx, gy = jnp.meshgrid(grid, grid)
    logits = predict(model, jnp.stack([gx.ravel(), gy.ravel()], axis=-1))
    inner_prob = jax.nn.softmax(logits, axis=-1)[:, 0].reshape(gx.shape)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.5))
    left.plot(losses)
    left.set_yscale("log")
    left.set_xlabel("Adam step")
    left.set_ylabel("cross-entropy")
    left.set_title("training loss")
    right.contourf(gx, gy, inner_prob, levels=20, cmap="RdBu", alpha=0.6)
    right.scatter(x[:, 0], x[:, 1], c=labels, cmap="RdBu_r", s=6, edgecolors="none")
    right.set_aspect("equal")
    right.set_title(title)
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer points and epochs (for CI)")
    parser.add_argument(
        "--adjoint", choices=("recursive", "direct", "backsolve"), default="recursive"
    )
    parser.add_argument("--checkpoints", type=int, help="states kept by 'recursive'")
    parser.add_argument("--memory-budget", type=int, help="bytes of states for 'recursive'")
    parser.add_argument("--epochs", type=int, help="passes over the data (default 40, quick 20)")
    parser.add_argument("--out", default="training_loop.png")
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    """Run the example; returns losses, accuracy, the adjoint and the step's temp memory."""
    args = parse_args(argv)
    epochs = args.epochs or (20 if args.quick else 40)
    count = 256 if args.quick else 1024
    data_key, model_key, shuffle_key = jax.random.split(jax.random.PRNGKey(0), 3)
    x, labels = rings(data_key, count)
    adjoint = make_adjoint(args.adjoint, args.checkpoints, args.memory_budget)
    print(f"adjoint: {adjoint}")

    start = time.perf_counter()
    model, losses, temp_bytes = train(
        Classifier(adjoint, key=model_key),
        x,
        labels,
        epochs=epochs,
        batch_size=32,
        key=shuffle_key,
    )
    seconds = time.perf_counter() - start
    acc = accuracy(model, x, labels)
    print(
        f"{epochs} epochs in {seconds:.1f} s (compile included); loss {losses[0]:.3f} -> "
        f"{losses[-1]:.3f}; training accuracy {acc:.1%}; training step temp memory "
        f"{temp_bytes} bytes"
    )
    plot(model, x, labels, losses, f"decision regions, accuracy {acc:.1%}", args.out)
    print(f"wrote {args.out}")
    return {
        "adjoint": type(adjoint).__name__,
        "initial_loss": losses[0],
        "final_loss": losses[-1],
        "accuracy": acc,
        "temp_bytes": temp_bytes,
        "seconds": seconds,
        "out": args.out,
    }


if __name__ == "__main__":
    main()
