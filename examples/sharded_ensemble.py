"""An ensemble of solves sharded across devices with jax.sharding, checked against the
same ensemble solved on one device.

Each member is a Lotka-Volterra solve with its own prey growth rate a and predation rate
b (a grid of parameters). The batch axis is laid out over a one-dimensional device mesh
(`Mesh(devices, ("batch",))`, `NamedSharding(mesh, PartitionSpec("batch"))`); the jitted,
vmapped solve then runs each device's slice of the batch on that device, with no
communication, and its output stays sharded the same way. The figure maps the peak prey
population over the (a, b) grid.

On a CPU the script asks XLA for 8 host devices (XLA_FLAGS=
--xla_force_host_platform_device_count=8, set before jax is imported unless XLA_FLAGS is
already set). Those are simulated devices sharing the machine's cores: they show that the
sharding is right, not how fast real devices would be, and the script says so. On GPUs or
TPUs the same code uses the real devices.

Multi-host: call `jax.distributed.initialize()` first on every process (it reads the
coordinator address, process count and id from the cluster environment, or takes them as
arguments). `jax.devices()` then lists the devices of all hosts, so the mesh below spans
them unchanged; each process builds only its own rows of the batch, e.g. with
`jax.make_array_from_process_local_data(sharding, local_rows)`, and reads back its
addressable shards (`out.addressable_shards`) instead of gathering the whole array.

    python examples/sharded_ensemble.py [--quick] [--out sharded_ensemble.png]
"""

import os

# Before jax is imported: the device count is fixed when its CPU backend starts.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import matplotlib  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import odesolve as ode  # noqa: E402

jax.config.update("jax_enable_x64", True)


def lotka_volterra(t, y, params):
    """Prey x and predators z: dx = a x - b x z, dz = -c z + d x z."""
    a, b, c, d = params
    x, z = y
    return jnp.stack([a * x - b * x * z, -c * z + d * x * z])


def solve_member(params, ts):
    """One member's populations at ts, shape (len(ts), 2), from (x, z) = (1, 1)."""
    sol = ode.diffeqsolve(
        ode.ODETerm(lotka_volterra),
        ode.Tsit5(),
        t0=ts[0],
        t1=ts[-1],
        dt0=0.01,
        y0=jnp.ones(2, dtype=ts.dtype),
        args=params,
        saveat=ode.SaveAt(ts=ts),
        stepsize_controller=ode.PIDController(rtol=1e-8, atol=1e-8),
        max_steps=8192,
    )
    return sol.ys


@jax.jit
def solve_ensemble(params, ts):
    """All members: params (batch, 4) -> populations (batch, len(ts), 2)."""
    return jax.vmap(solve_member, in_axes=(0, None))(params, ts)


def parameter_grid(side: int):
    """side x side values of (a, b) around (1.5, 1.0), with c = 3 and d = 1 fixed."""
    a, b = jnp.meshgrid(jnp.linspace(1.0, 2.0, side), jnp.linspace(0.5, 1.5, side))
    ones = jnp.ones_like(a.ravel())
    return jnp.stack([a.ravel(), b.ravel(), 3.0 * ones, ones], axis=-1)


def batch_sharding():
    """Rows of a batch split evenly over every device, along a mesh axis named "batch"."""
    mesh = Mesh(np.array(jax.devices()), axis_names=("batch",))
    return NamedSharding(mesh, PartitionSpec("batch"))


def simulated_devices() -> bool:
    """Whether the devices are CPU devices that XLA's --xla_force_host_platform_device_count
    made out of one host's cores."""
    return jax.devices()[0].platform == "cpu" and len(jax.devices()) > 1


def describe_devices() -> str:
    """What the mesh runs on, saying so when its devices are simulated."""
    devices = jax.devices()
    if simulated_devices():
        return (
            f"{len(devices)} simulated CPU devices on {os.cpu_count()} cores: timings say "
            "nothing about real multi-device speed"
        )
    return f"{len(devices)} {devices[0].platform.upper()} device(s) ({devices[0].device_kind})"


def timed(fn, *args):
    """fn(*args) once to compile, then once timed; returns (result, seconds)."""
    jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    result = jax.block_until_ready(fn(*args))
    return result, time.perf_counter() - start


def plot(params, ys, side: int, out: str) -> None:
    peak_prey = np.asarray(ys[:, :, 0].max(axis=1)).reshape(side, side)
    a, b = np.asarray(params[:, 0]), np.asarray(params[:, 1])
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    image = ax.imshow(
        peak_prey,
        origin="lower",
        extent=(a.min(), a.max(), b.min(), b.max()),
        aspect="auto",
        cmap="viridis",
    )
    fig.colorbar(image, label="peak prey population on [0, 10]")
    ax.set_xlabel("prey growth rate a")
    ax.set_ylabel("predation rate b")
    kind = "simulated CPU devices" if simulated_devices() else "devices"
    ax.set_title(f"{side * side} solves sharded over {len(jax.devices())} {kind}")
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="an 8 x 8 grid (for CI)")
    parser.add_argument("--out", default="sharded_ensemble.png")
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    """Run the example; returns the device count, the largest sharded/unsharded difference
    and both timings."""
    args = parse_args(argv)
    side = 8 if args.quick else 32  # side**2 is a multiple of 8 devices
    params, ts = parameter_grid(side), jnp.linspace(0.0, 10.0, 200)
    sharding = batch_sharding()
    sharded_params = jax.device_put(params, sharding)
    sharded, sharded_seconds = timed(solve_ensemble, sharded_params, ts)
    single_device = jax.device_put(params, jax.devices()[0])
    unsharded, unsharded_seconds = timed(solve_ensemble, single_device, ts)

    output_spec = str(getattr(sharded.sharding, "spec", sharded.sharding))
    max_difference = float(jnp.max(jnp.abs(np.asarray(sharded) - np.asarray(unsharded))))
    print(f"devices: {describe_devices()}")
    print(
        f"{params.shape[0]} solves on {len(jax.devices())} devices; output sharding "
        f"{output_spec}; {sharded_seconds:.3f} s sharded, {unsharded_seconds:.3f} s "
        f"on one device; max |sharded - unsharded| = {max_difference:.1e}"
    )
    plot(params, sharded, side, args.out)
    print(f"wrote {args.out}")
    return {
        "devices": len(jax.devices()),
        "simulated_devices": simulated_devices(),
        "members": int(params.shape[0]),
        "output_spec": output_spec,
        "max_difference": max_difference,
        "sharded_seconds": sharded_seconds,
        "unsharded_seconds": unsharded_seconds,
        "out": args.out,
    }


if __name__ == "__main__":
    main()
