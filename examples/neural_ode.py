"""Fit a neural ODE to trajectories of a damped spiral, and plot what it learned.

The data are 32 trajectories of the linear system dy/dt = A y, A = [[-0.1, 2], [-2, -0.1]]
(a spiral sink), observed at 40 times on [0, 5]. The model is dy/dt = MLP(y), an equinox
MLP, solved with Tsit5 and a PID controller; its parameters are fitted with optax's Adam in
a jitted training step (eqx.filter_jit + eqx.filter_value_and_grad), the gradient coming
through the solver by the default adjoint (exact, checkpointed within a memory budget).

The fit is then continued to t = 15, three times the training window, in one solve that
shows a progress bar (tqdm, or a text meter when tqdm is not installed). The figure shows
the loss curve, two true and fitted trajectories in the phase plane, and the error of six
trajectories in time; both mark t = 5, where the training window ends and extrapolation
begins.

    python examples/neural_ode.py [--quick] [--steps N] [--out neural_ode.png]
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

SPIRAL = ((-0.1, 2.0), (-2.0, -0.1))
# Bounds the steps of one solve; it also sizes the reverse sweep's
# storage, so it is kept near what the problem needs rather than at the default 4096.
MAX_STEPS = 256


def true_field(t, y, args):
    """The system the data come from: dy/dt = A y, a spiral sink."""
    return jnp.asarray(SPIRAL, dtype=y.dtype) @ y


class NeuralField(eqx.Module):
    """dy/dt = MLP(y): 2 -> width -> width -> 2 with tanh activations."""

    mlp: eqx.nn.MLP

    def __init__(self, width: int, *, key):
        self.mlp = eqx.nn.MLP(2, 2, width, depth=2, activation=jnp.tanh, key=key)

    def __call__(self, t, y, args):
        return self.mlp(y)


def solve(field, y0, ts, progress_meter=ode.NoProgressMeter()):
    """y(ts) for the initial state y0 (shape (2,) or (batch, 2)); time is the first axis."""
    sol = ode.diffeqsolve(
        ode.ODETerm(field),
        ode.Tsit5(),
        t0=ts[0],
        t1=ts[-1],
        dt0=0.1,
        y0=y0,
        saveat=ode.SaveAt(ts=ts),
        stepsize_controller=ode.PIDController(rtol=1e-4, atol=1e-6),
        max_steps=MAX_STEPS,
        progress_meter=progress_meter,
    )
    return sol.ys


def make_data(key, num_trajectories: int, ts):
    """Initial states uniform in [-1.5, 1.5]^2 and their true trajectories."""
    y0s = jax.random.uniform(key, (num_trajectories, 2), minval=-1.5, maxval=1.5)
    return y0s, jax.vmap(lambda y0: solve(true_field, y0, ts))(y0s)


def batch_loss(model, y0s, ts, targets):
    """Mean squared error between the model's trajectories and the data."""
    predictions = jax.vmap(lambda y0: solve(model, y0, ts))(y0s)
    return jnp.mean((predictions - targets) ** 2)


def make_train_step(optimizer):
    """One Adam step on the whole data set, compiled once."""

    @eqx.filter_jit
    def train_step(model, opt_state, y0s, ts, targets):
        loss, grads = eqx.filter_value_and_grad(batch_loss)(model, y0s, ts, targets)
        updates, opt_state = optimizer.update(grads, opt_state, model)
        return eqx.apply_updates(model, updates), opt_state, loss

    return train_step


def fit(model, y0s, ts, targets, *, steps: int, learning_rate: float):
    """Train with Adam; returns the fitted model and the loss at every step."""
    optimizer = optax.adam(learning_rate)
    opt_state = optimizer.init(eqx.filter(model, eqx.is_inexact_array))
    train_step = make_train_step(optimizer)
    losses = []
    for step in range(steps):
        model, opt_state, loss = train_step(model, opt_state, y0s, ts, targets)
        losses.append(float(loss))
        if step % max(1, steps // 10) == 0 or step == steps - 1:
            print(f"step {step:4d}  loss {losses[-1]:.3e}", flush=True)
    return model, losses


def progress_meter():
    """A tqdm bar when tqdm is installed, else percentages printed to stderr."""
    try:
        return ode.TqdmProgressMeter()
    except ImportError:
        return ode.TextProgressMeter()


class RowwiseField(eqx.Module):
    """A field on one state, applied to every row of a (batch, 2) state."""

    field: eqx.Module

    def __call__(self, t, ys, args):
        return jax.vmap(lambda y: self.field(t, y, args))(ys)


@eqx.filter_jit
def extrapolate(model, y0s, ts, meter):
    """True and fitted trajectories from each y0 on ts, shape (batch, len(ts), 2).

    The fitted batch is one solve of the stacked state (shared steps), not a vmap of
    solves, so the progress meter tracks a single solve from t0 to t1.
    """
    truth = jax.vmap(lambda y0: solve(true_field, y0, ts))(y0s)
    fitted = solve(RowwiseField(model), y0s, ts, meter)
    return truth, jnp.swapaxes(fitted, 0, 1)


def plot(losses, ts, truth, fitted, t_train: float, out: str) -> None:
    """Loss curve; two trajectories in the phase plane; every trajectory's error in time.

    The end of the training window is marked in both trajectory panels: beyond it the fit
    is extrapolating.
    """
    fig, (loss_ax, phase, error) = plt.subplots(
        1, 3, figsize=(15, 5), gridspec_kw=dict(width_ratios=(1, 1.25, 1))
    )
    loss_ax.semilogy(losses)
    loss_ax.set_xlabel("Adam step")
    loss_ax.set_ylabel("mean squared error")
    loss_ax.set_title("training loss")

    # Two trajectories, the one starting furthest out and one starting about half as far.
    radii = jnp.linalg.norm(truth[:, 0], axis=-1)
    outer = int(jnp.argmax(radii))
    inner = int(jnp.argmin(jnp.abs(radii - radii[outer] / 2)))
    end = int(jnp.searchsorted(ts, t_train))  # the first time at or past the window's end
    for i, color in ((outer, "tab:blue"), (inner, "tab:red")):
        phase.plot(truth[i, :, 0], truth[i, :, 1], color=color, lw=4.0, alpha=0.25)
        phase.plot(fitted[i, :, 0], fitted[i, :, 1], "--", color=color, lw=1.2)
        phase.plot(*truth[i, 0], "o", color=color, ms=7)
        phase.plot(*fitted[i, end], "X", color="black", mec="white", ms=10, zorder=3)
    phase.plot([], [], color="gray", lw=4.0, alpha=0.25, label="true")
    phase.plot([], [], "--", color="gray", lw=1.2, label="neural ODE")
    phase.plot([], [], "o", color="gray", ms=7, label="start, t = 0")
    phase.plot([], [], "X", color="black", ms=9, label=f"end of training window, t = {t_train:g}")
    phase.set_xlabel("$y_1$")
    phase.set_ylabel("$y_2$")
    phase.set_aspect("equal", adjustable="datalim")
    phase.set_title(f"phase plane, t in [0, {ts[-1]:g}]")
    phase.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)

    gap = jnp.linalg.norm(fitted - truth, axis=-1)  # (trajectories, times)
    for i in range(gap.shape[0]):
        error.semilogy(ts, gap[i], lw=1.0)
    error.axvspan(ts[0], t_train, color="gray", alpha=0.15, lw=0)
    error.axvline(t_train, color="black", lw=1.0, ls=":")
    top = error.get_xaxis_transform()
    error.text(t_train / 2, 0.97, "training\nwindow", transform=top, ha="center", va="top")
    error.text(t_train * 1.05, 0.97, "extrapolation", transform=top, ha="left", va="top")
    error.set_xlabel("t")
    error.set_ylabel("|fitted - true|")
    error.set_title(f"error of each of the {gap.shape[0]} trajectories")
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small, short run (for CI)")
    parser.add_argument("--steps", type=int, help="Adam steps (default 600, quick 100)")
    parser.add_argument("--out", default="neural_ode.png", help="where to write the figure")
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    """Run the example; returns the losses, the extrapolation error and the figure's path."""
    args = parse_args(argv)
    steps = args.steps or (100 if args.quick else 600)
    count, learning_rate = (8, 1e-2) if args.quick else (32, 3e-3)
    data_key, model_key = jax.random.split(jax.random.PRNGKey(0))
    t_train = 5.0
    ts = jnp.linspace(0.0, t_train, 40)
    y0s, targets = make_data(data_key, count, ts)

    start = time.perf_counter()
    model, losses = fit(
        NeuralField(32, key=model_key), y0s, ts, targets, steps=steps, learning_rate=learning_rate
    )
    train_seconds = time.perf_counter() - start

    long_ts = jnp.linspace(0.0, 3 * t_train, 300)
    truth, fitted = extrapolate(model, y0s[:6], long_ts, progress_meter())
    extrapolation_error = float(jnp.max(jnp.abs(truth - fitted)))
    plot(losses, long_ts, truth, fitted, t_train, args.out)
    print(
        f"loss {losses[0]:.3e} -> {losses[-1]:.3e} in {steps} steps ({train_seconds:.1f} s); "
        f"max |fitted - true| on [0, {3 * t_train:g}]: {extrapolation_error:.3f}; wrote {args.out}"
    )
    return {
        "initial_loss": losses[0],
        "final_loss": losses[-1],
        "extrapolation_error": extrapolation_error,
        "train_seconds": train_seconds,
        "out": args.out,
    }


if __name__ == "__main__":
    main()
