"""The PyTorch peers, torchdiffeq and torchode, as eager entries of W1, W2, W3 and W6.

Imported only when one of them is installed (importing this imports torch). Each entry
solves its workload's problem from the same values as the JAX entries: the arrays are
copied into tensors once, when the entry is made, and W3/W6's MLP gets the equinox MLP's
weights, so every row's error is against the same reference. Functions return numpy
arrays and a `Work` of the steps and evaluations the library counted.

- torchdiffeq has no Tsit5: it runs Dopri5 (order 5, FSAL, 6 evaluations a step) with its
  own integral controller (safety 0.9, step factors 0.2-10: Diffrax's `PIDController`
  defaults). It solves a batch as one system: one step size for every sample, the error
  norm taken over the whole batch. Gradients by backprop through the solver (`odeint`) or
  by its continuous adjoint (`odeint_adjoint`, W3 only: ~10x slower).
- torchode runs Tsit5 with `IntegralController` (Diffrax's `PIDController` with its default
  coefficients is an integral controller) and `AutoDiffAdjoint` (backprop through the
  solver). It is batch-native: each sample has its own step size, as `vmap` of
  `diffeqsolve` gives; its steps are those of the slowest sample, its evaluations are calls
  of the batched field.
- Threads: `THREADS`, one. XLA:CPU runs these loops on one thread (process CPU time equals
  wall time on the 2-core machine). torch at 2 threads, its default there, was never
  faster: on W3's torchode step 46 ms against 35 ms at one thread with the machine quiet,
  at twice the CPU time (OpenMP threads spin), and 30-70x slower under load from other
  users (each of thousands of tiny parallel regions waits for a descheduled thread).
- Eager: torchode's TorchScript compile (`torch.jit.script`) fails under torch 2.13 with an
  internal assert. `torch.compile` was not tried: both solvers' loops read a tensor on the
  host every step to decide whether to go on, which splits a captured graph per step.
"""

from collections.abc import Callable

import jax
import numpy as np
import torch
import torchdiffeq
import torchode

from ._spec import Entry, Work

THREADS = 1
torch.set_num_threads(THREADS)


def _tensor(array, requires_grad: bool = False) -> torch.Tensor:
    """A copy of a JAX or numpy array as a CPU tensor of the same dtype."""
    return torch.from_numpy(np.array(array)).requires_grad_(requires_grad)


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().numpy()


def _label(peer: str, which: int) -> str:
    """The row label of a peer's forward (0) or gradient (1) entry; a peer without a
    forward entry is never asked for one."""
    label = LABELS[peer][which]
    assert label is not None
    return label


def _eager(library: str, run: Callable[[], tuple]) -> Entry:
    """An eager entry: `run() -> (result, Work)` ignores the case's (JAX) inputs, having its
    own tensors of the same values. Its tensors live on the CPU; beside JAX on a GPU the
    label says so."""
    where = "" if jax.default_backend() == "cpu" else " on CPU"
    return Entry(library + where, lambda rows: lambda *inputs: run(), eager=True)


# --- the vector fields -----------------------------------------------------------------


class LotkaVolterra(torch.nn.Module):
    """`_problems.lotka_volterra` in torch operations, on states of shape (..., 2)."""

    def __init__(self, rates: torch.Tensor):
        super().__init__()
        self.rates = rates  # (a, b, c, d); a plain attribute, so backprop reaches it

    def forward(self, t, y: torch.Tensor) -> torch.Tensor:
        a, b, c, d = self.rates.unbind()
        x, z = y[..., 0], y[..., 1]
        return torch.stack([a * x - b * x * z, -c * z + d * x * z], dim=-1)


class NeuralField(torch.nn.Module):
    """W3's field: an MLP 2 -> 64 -> 64 -> 2 (softplus, final tanh) with the weights of the
    equinox MLP `params` (`eqx.nn.Linear` stores weight as (out, in), as `torch.nn.Linear`)."""

    def __init__(self, params):
        super().__init__()
        layers = []
        for layer in params.layers:
            out_size, in_size = layer.weight.shape
            linear = torch.nn.Linear(in_size, out_size, dtype=_tensor(layer.weight).dtype)
            with torch.no_grad():
                linear.weight.copy_(_tensor(layer.weight))
                linear.bias.copy_(_tensor(layer.bias))
            layers += [linear, torch.nn.Softplus()]
        layers[-1] = torch.nn.Tanh()
        self.mlp = torch.nn.Sequential(*layers)

    def forward(self, t, y: torch.Tensor) -> torch.Tensor:
        return self.mlp(y)


class CountedField(torch.nn.Module):
    """A field that counts its calls and torchdiffeq's steps (its `callback_step` hook is
    called once per attempted step), for torchdiffeq, which reports neither."""

    def __init__(self, field: torch.nn.Module):
        super().__init__()
        self.field, self.evals, self.steps = field, 0, 0

    def forward(self, t, y: torch.Tensor) -> torch.Tensor:
        self.evals += 1
        return self.field(t, y)

    def callback_step(self, t0, y0, dt) -> None:
        self.steps += 1

    def reset(self) -> None:
        self.evals, self.steps = 0, 0


# --- the two solvers, on a batch -------------------------------------------------------


def dopri5(field: CountedField, y0, ts, tolerance: float, dt0: float, adjoint: bool = False):
    """torchdiffeq's Dopri5 from ts[0]: states at `ts`, (len(ts),) + y0.shape, and the Work
    of the forward solve (counted before any backward pass calls the field again)."""
    field.reset()
    odeint = torchdiffeq.odeint_adjoint if adjoint else torchdiffeq.odeint
    options = dict(first_step=dt0)
    ys = odeint(field, y0, ts, rtol=tolerance, atol=tolerance, method="dopri5", options=options)
    return ys, Work(field.steps, field.evals)


def _batch_first(solution: tuple) -> tuple:
    ys, work = solution
    return torch.movedim(ys, 0, 1), work


def tsit5(field: torch.nn.Module, tolerance: float, dt0: float) -> Callable:
    """torchode's Tsit5 with an integral controller and backprop through the solver, made
    once: `solve(y0s, ts)` for a batch y0s (batch, n) returns the states at `ts`
    (batch, len(ts), n) and the Work of the slowest sample."""
    term = torchode.ODETerm(field)
    controller = torchode.IntegralController(atol=tolerance, rtol=tolerance, term=term)
    solver = torchode.AutoDiffAdjoint(torchode.Tsit5(term=term), controller)

    def solve(y0s, ts):
        batch = y0s.shape[0]
        problem = torchode.InitialValueProblem(y0=y0s, t_eval=ts.expand(batch, -1))
        sol = solver.solve(problem, dt0=torch.full((batch,), dt0, dtype=ts.dtype))
        if not bool((sol.status == 0).all()):
            raise RuntimeError(f"torchode failed: status {sol.status.unique().tolist()}")
        stats = sol.stats
        return sol.ys, Work(int(stats["n_steps"].max()), int(stats["n_f_evals"].max()))

    return solve


def _solvers(peers: dict, field, tolerance: float, dt0: float, adjoint: bool = False) -> dict:
    """`solve(y0s, ts) -> (ys, Work)` for each installed PyTorch peer (keys of `LABELS`),
    y0s (batch, n), ys (batch, len(ts), n); with `adjoint`, torchdiffeq's adjoint too."""
    solvers = {}
    if "torchdiffeq" in peers:
        counted = CountedField(field)
        solvers["torchdiffeq"] = lambda y0s, ts: _batch_first(
            dopri5(counted, y0s, ts, tolerance, dt0)
        )
        if adjoint:
            solvers["torchdiffeq adjoint"] = lambda y0s, ts: _batch_first(
                dopri5(counted, y0s, ts, tolerance, dt0, adjoint=True)
            )
    if "torchode" in peers:
        solvers["torchode"] = tsit5(field, tolerance, dt0)
    return solvers


# Row labels: (forward, gradient) per solver of `_solvers`.
LABELS: dict[str, tuple[str | None, str]] = {
    "torchdiffeq": ("torchdiffeq (Dopri5)", "torchdiffeq (Dopri5, backprop)"),
    "torchdiffeq adjoint": (None, "torchdiffeq (Dopri5, odeint_adjoint)"),
    "torchode": ("torchode (Tsit5)", "torchode (Tsit5, AutoDiffAdjoint)"),
}


# --- the workloads ---------------------------------------------------------------------


def lotka_volterra_entries(
    peers: dict, ts, y0, rates, *, gradient: bool, tolerance: float, dt0: float
) -> list[Entry]:
    """W1 (states at `ts`, (len(ts), 2)) or W2 (gradient of sum(ys**2) w.r.t. `rates`) for
    each installed PyTorch peer: one float64 solve, as a batch of one."""
    ts, y0s = _tensor(ts), _tensor(y0)[None]
    rates = _tensor(rates, requires_grad=gradient)
    solvers = _solvers(peers, LotkaVolterra(rates), tolerance, dt0)
    one = lambda solve: lambda: _first_sample(solve(y0s, ts))
    if not gradient:
        return [_eager(_label(name, 0), _forward(one(s))) for name, s in solvers.items()]
    return [_eager(LABELS[name][1], _rates_gradient(one(s), rates)) for name, s in solvers.items()]


def neural_entries(
    peers: dict, params, y0s, ts, *, gradient: bool, adjoint: bool, tolerance: float, dt0: float
) -> list[Entry]:
    """W3/W6 for each installed PyTorch peer: the batch's states at `ts`, (batch, len(ts),
    2), or `(mean(ys**2), its gradient w.r.t. the MLP)`; with `adjoint`, torchdiffeq's
    adjoint as well."""
    field, y0s, ts = NeuralField(params), _tensor(y0s), _tensor(ts)
    solvers = _solvers(peers, field, tolerance, dt0, adjoint=gradient and adjoint)
    batch = lambda solve: lambda: solve(y0s, ts)
    if not gradient:
        return [_eager(_label(name, 0), _forward(batch(s))) for name, s in solvers.items()]
    parameters = tuple(field.parameters())
    return [
        _eager(LABELS[name][1], _mlp_gradient(batch(s), parameters)) for name, s in solvers.items()
    ]


def _first_sample(solution: tuple) -> tuple:
    ys, work = solution
    return ys[0], work


def _forward(solve: Callable) -> Callable:
    """`() -> (ys, Work)` of a solve, run without recording a graph."""

    def run():
        with torch.no_grad():
            ys, work = solve()
        return _numpy(ys), work

    return run


def _rates_gradient(solve: Callable, rates: torch.Tensor) -> Callable:
    """`() -> (d sum(ys**2) / d rates, Work)`, by backprop through the solve."""

    def run():
        ys, work = solve()
        (grad,) = torch.autograd.grad(torch.sum(ys**2), rates)
        return _numpy(grad), work

    return run


def _mlp_gradient(solve: Callable, parameters: tuple) -> Callable:
    """`() -> ((mean(ys**2), its gradient w.r.t. `parameters`), Work)`, as W3's JAX
    entries return `value_and_grad`."""

    def run():
        ys, work = solve()
        loss = torch.mean(ys**2)
        grads = torch.autograd.grad(loss, parameters)
        return (loss.item(), [_numpy(g) for g in grads]), work

    return run
