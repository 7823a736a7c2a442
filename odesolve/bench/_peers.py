"""The libraries measured side by side, and adapters for the ones without Diffrax's API.

odesolve and Diffrax share one API, so a workload builds both from the same code given
the module. `jax.experimental.ode.odeint` (Dopri5, backsolve adjoint) gets an adapter. A
peer that is not installed is skipped with one line saying how to install it.
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
    """

    name: str
    module: str
    install: str
    adapted: bool = True

    def load(self) -> ModuleType | None:
        """The imported module, or None when it is not installed."""
        try:
            return importlib.import_module(self.module)
        except ImportError:
            return None


PEERS = (
    Peer("odesolve", "odesolve", "pip install -e ."),
    Peer("diffrax", "diffrax", "pip install diffrax  (or: pip install -e '.[bench]')"),
    Peer("jax.experimental.ode", "jax.experimental.ode", "it ships with jax"),
    # The PyTorch solvers run outside XLA and need a torch install of their own (gigabytes
    # with CUDA); the bench reports them when present but does not drive them yet.
    Peer("torchdiffeq", "torchdiffeq", "pip install torchdiffeq", adapted=False),
    Peer("torchode", "torchode", "pip install torchode", adapted=False),
)


def load_peers() -> tuple[dict[str, ModuleType], list[str]]:
    """The installed peers by name, and one note for each peer that will not be measured."""
    loaded, notes = {}, []
    for peer in PEERS:
        module = peer.load()
        if module is None:
            notes.append(f"{peer.name} skipped: not installed ({peer.install})")
        elif not peer.adapted:
            notes.append(f"{peer.name} is installed, but odesolve.bench has no adapter for it")
        else:
            loaded[peer.name] = module
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
