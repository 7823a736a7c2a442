"""Which device the bench runs on: `--device cpu|gpu`, or JAX's own choice (`JAX_PLATFORMS`)."""

import os

import jax

# `--device` names what a user asks for; JAX names the platform that provides it.
PLATFORMS = {"cpu": "cpu", "gpu": "cuda"}


class DeviceUnavailable(RuntimeError):
    """The device asked for is not there; the message is one sentence for the user."""


def _what_was_asked(device: str | None) -> str:
    if device is not None:
        return f"--device {device}"
    return f"JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS', '')}"


def _unavailable(device: str | None) -> DeviceUnavailable:
    asked = _what_was_asked(device)
    if device == "gpu" or "cuda" in asked or "gpu" in asked:
        return DeviceUnavailable(
            f"No GPU is available to JAX on this machine ({asked} asks for one): install JAX "
            'with CUDA (pip install -U "jax[cuda12]") on a machine with an NVIDIA GPU, or run '
            "on the CPU with --device cpu."
        )
    return DeviceUnavailable(
        f"JAX has no device for {asked} on this machine: run with --device cpu or --device gpu."
    )


def select(device: str | None) -> jax.Device:
    """Point JAX at `device` ("cpu", "gpu", or None for JAX's own choice) and return the
    device the bench will run on. Must be called before JAX initialises its backends (before
    any array exists), since the platform is fixed from then on.

    Raises DeviceUnavailable when the device is not there.
    """
    if device is not None:
        jax.config.update("jax_platforms", PLATFORMS[device])
    try:
        return jax.devices()[0]
    # jax 0.10 answers a platform it cannot start (JAX_PLATFORMS=cuda without a GPU) with a
    # bare AssertionError, other versions with a RuntimeError.
    except (RuntimeError, AssertionError):
        raise _unavailable(device) from None
