"""The libraries measured side by side, and adapters for the ones without Diffrax's API.

odesolve and Diffrax share one API, so a workload builds both from the same code given
the module. `jax.experimental.ode.odeint` (Dopri5, backsolve adjoint) gets an adapter
here; the PyTorch peers, torchdiffeq and torchode, get theirs in `_torch`. A peer that is
not installed is skipped with one line saying how to install it.
"""

import dataclasses
import importlib
from collections.abc import Callable
from types import ModuleType

import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Peer:
    """A library measured against odesolve.

    - `name`: how the table and JSON name it.
    - `module`: what to import.
    - `install`: the command that installs it.
    - `adapted`: whether the bench has workloads for it; an installed peer without them is
      reported rather than silently ignored.
    - `notes`: what a reader of the table must know about its rows (printed once each,
      when it is installed).
    - `role`: for a library the bench uses but does not measure (`TOOLS`), what for.
    """

    name: str
    module: str
    install: str
    adapted: bool = True
    notes: tuple[str, ...] = ()
    role: str = ""

    def load(self) -> ModuleType | None:
        """The imported module, or None when it is not installed."""
        try:
            return importlib.import_module(self.module)
        except ImportError:
            return None


# On PyPI `torch` is the CUDA build (gigabytes); the CPU wheel comes from PyTorch's index.
_TORCH_INSTALL = "pip install torch --index-url https://download.pytorch.org/whl/cpu; pip install"
_TORCH_NOTE = (
    "PyTorch peers: eager, on 1 thread as XLA runs these loops (see odesolve/bench/_torch.py); "
    "compile s = first call minus median (~); not run on W4 (XLA temp memory, 1e4-step loops), "
    "W5 (no implicit solver) or W7 (XLA compile time)"
)
_TORCHDIFFEQ_NOTE = (
    "torchdiffeq: Dopri5 (it has no Tsit5) and its own integral controller; a batch (W3, W6) "
    "is one system with one step size; steps and evaluations counted by wrapping the field",
    _TORCH_NOTE,
)
_TORCHODE_NOTE = (
    "torchode: Tsit5, IntegralController, AutoDiffAdjoint; batch-native (a step size per "
    "sample; steps of the slowest sample and evaluations of the batched field, from sol.stats)",
    _TORCH_NOTE,
)

# The bench's own extra: Diffrax, scipy and matplotlib.
BENCH_EXTRA = 'pip install -e ".[bench]"'

PEERS = (
    Peer("odesolve", "odesolve", "pip install -e ."),
    Peer("diffrax", "diffrax", BENCH_EXTRA),
    Peer("jax.experimental.ode", "jax.experimental.ode", "it ships with jax"),
    # The PyTorch solvers run outside XLA, eagerly, and need a torch install of their own.
    Peer("torchdiffeq", "torchdiffeq", _TORCH_INSTALL + " torchdiffeq", notes=_TORCHDIFFEQ_NOTE),
    Peer("torchode", "torchode", _TORCH_INSTALL + " torchode", notes=_TORCHODE_NOTE),
)


# Not measured, but behind two of the bench's outputs.
TOOLS = (
    Peer("scipy", "scipy", BENCH_EXTRA, role="reference solutions, the error column"),
    Peer("matplotlib", "matplotlib", BENCH_EXTRA, role="the chart"),
)


def installed(candidates: tuple[Peer, ...]) -> tuple[dict[str, ModuleType], list[Peer]]:
    """Of `candidates`, the installed modules by name and the peers that are missing."""
    found, missing = {}, []
    for peer in candidates:
        module = peer.load()
        if module is None:
            missing.append(peer)
        else:
            found[peer.name] = module
    return found, missing


def load_peers() -> tuple[dict[str, ModuleType], list[str]]:
    """The installed peers by name, and notes: one for each peer that will not be measured,
    and what to know about the rows of those that will."""
    loaded, notes = {}, []
    for peer in PEERS:
        module = peer.load()
        if module is None:
            notes.append(f"{peer.name} skipped: not installed ({peer.install})")
        elif not peer.adapted:
            notes.append(f"{peer.name} is installed, but odesolve.bench has no adapter for it")
        else:
            loaded[peer.name] = module
            notes += [note for note in peer.notes if note not in notes]
    return loaded, notes


def odeint_solve(
    odeint_module: ModuleType, field: Callable, y0, ts, args, *, rtol: float, atol: float
):
    """`jax.experimental.ode.odeint` on a Diffrax-style `field(t, y, args)`.

    odeint always integrates from ts[0] and differentiates by backsolve; its states at
    `ts`, with no step count (it reports none).
    """
    swapped = lambda y, t, args: field(t, y, args)
    return odeint_module.odeint(swapped, y0, jnp.asarray(ts), args, rtol=rtol, atol=atol)
