"""Which outputs an adjoint can differentiate: an adjoint that differentiates only some
`SaveAt` options lists them (`AbstractAdjoint.saveat_options`, an allow-list), and a
solve asking for any other is refused before it runs. A `SaveAt` option added later is
thus refused by such an adjoint until it says otherwise."""

from adjoints import AbstractAdjoint

from ._results import UnsupportedCombination
from ._saveat import SaveAt, SubSaveAt, save_y


def options_used(saveat: SaveAt) -> tuple[str, ...]:
    """The `SaveAt` options `saveat` sets, by field name (`subs`: anything but one
    `SubSaveAt`)."""
    sub = saveat.subs
    used = {
        "subs": not isinstance(sub, SubSaveAt),
        "dense": saveat.dense,
        "solver_state": saveat.solver_state,
        "controller_state": saveat.controller_state,
        "made_jump": saveat.made_jump,
    }
    if isinstance(sub, SubSaveAt):
        used |= {
            "t0": sub.t0,
            "t1": sub.t1,
            "ts": sub.ts is not None,
            "steps": bool(sub.steps),
            "fn": sub.fn is not save_y,
        }
    return tuple(name for name, on in used.items() if on)


def check_outputs(adjoint: AbstractAdjoint, saveat: SaveAt) -> None:
    """Refuse `saveat` if it sets an option `adjoint` does not differentiate."""
    allowed = adjoint.saveat_options()
    if allowed is None:
        return
    # Named as in `SaveAt(...)`; `subs` is refused when it holds several.
    refused = [
        "several subs" if name == "subs" else name
        for name in options_used(saveat)
        if name not in allowed
    ]
    if not refused:
        return
    name = type(adjoint).__name__
    spelt = {"t0": "t0=True", "t1": "t1=True", "ts": "ts=..."}
    fields = ", ".join(spelt[o] for o in spelt if o in allowed)
    raise UnsupportedCombination(
        f"adjoint={name}() with saveat={saveat!r}: {name} supports SaveAt({fields}) only "
        f"(or one SubSaveAt of those), not {', '.join(refused)}: it differentiates no other "
        "output. Use RecursiveCheckpointAdjoint() (the default) to differentiate those."
    )
