"""The lines a run opens with: where it runs and with what, which peers it found, what is
missing and the command that installs it, and what the error and ratio columns compare."""

import os
import platform
from types import ModuleType

import jax
import jaxlib

from ._peers import PEERS, TOOLS, Peer, installed

MODES = dict(
    quick="quick sizes (--full for the stated sizes)",
    full="the stated sizes",
    smoke="tiny sizes (a check that the bench runs, not a measurement)",
)

ERROR_NOTE = (
    "error: each result against a reference that no measured library computes, scipy's "
    "solve_ivp (DOP853, Radau when stiff) at tolerances of 1e-10 to 1e-13 with gradients "
    "from the forward sensitivity equations (W3p: the same gradients one sample at a time); "
    "what each case compares is listed under the table"
)
RATIO_NOTE = (
    "ratio: run time / diffrax's run time in the same case and run, W7 compile time / "
    "diffrax's (lower is better)"
)


def _named(name: str, module: ModuleType | None) -> str:
    """`name` and its version, where the module records one."""
    version = getattr(module, "__version__", None)
    return f"{name} {version}" if version else name


def _device_line(device: jax.Device) -> str:
    where = f"{device.platform}:{device.id} {device.device_kind}"
    if device.platform == "cpu":
        where += f", {os.cpu_count()} CPU cores"
    return (
        f"device: {where}; jax {jax.__version__}, jaxlib {jaxlib.__version__}, "
        f"Python {platform.python_version()}"
    )


def _found_line(label: str, found: dict[str, ModuleType], candidates: tuple[Peer, ...]) -> str:
    names = [
        _named(peer.name, found[peer.name]) + (f" ({peer.role})" if peer.role else "")
        for peer in candidates
        if peer.name in found
    ]
    return f"{label}: {', '.join(names) if names else 'none'}"


def _missing_lines(missing: list[Peer]) -> list[str]:
    """One line per install command, naming what it installs and what is lost without it."""
    by_command: dict[str, list[str]] = {}
    for peer in missing:
        by_command.setdefault(peer.install, []).append(peer.name)
    lines = [
        f"not installed: {', '.join(group)} ({command})" for command, group in by_command.items()
    ]
    names = {peer.name for peer in missing}
    if "diffrax" in names:
        lines.append("without diffrax the ratio column is empty and no chart is drawn")
    elif "matplotlib" in names:
        lines.append("without matplotlib no chart is drawn")
    return lines


def lines(device: jax.Device, mode: str, repeats: int) -> list[str]:
    """The opening lines of a run on `device` in `mode` with `repeats` timed calls."""
    found, missing = installed(PEERS + TOOLS)
    calls = f"{repeats} timed call{'s' if repeats != 1 else ''} per entry"
    return [
        f"{_named('odesolve.bench', found.get('odesolve'))}: {MODES[mode]}, "
        + ("up to " + calls + " (a time budget per case)" if mode == "quick" else calls),
        _device_line(device),
        _found_line("peers", found, tuple(p for p in PEERS if p.name != "odesolve")),
        _found_line("also uses", found, TOOLS),
        *_missing_lines(missing),
        ERROR_NOTE,
        RATIO_NOTE,
    ]


def missing_scipy_sentence() -> str | None:
    """The sentence that stops a run without scipy (every error needs its references)."""
    _, missing = installed(tuple(peer for peer in TOOLS if peer.name == "scipy"))
    if not missing:
        return None
    return (
        "odesolve.bench needs scipy for the reference solutions behind its error column: "
        f"{missing[0].install}"
    )
