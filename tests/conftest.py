"""Test configuration: float64 everywhere and strict dtype promotion, so an accidental
float32/float64 or int/float mix in the library is an error rather than a silent cast."""

import jax
import pytest

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """One worker per core when pytest-xdist is installed and no `-n` was given.

    The suite is compile-bound and XLA compiles on one thread, so workers divide its time
    by the cores. Without xdist (or with `-n 0`, `-p no:xdist`) it runs in this process.
    """
    if hasattr(config, "workerinput") or not config.pluginmanager.hasplugin("xdist"):
        return
    if config.option.numprocesses is None and not config.option.usepdb:
        config.option.numprocesses = "auto"
        config.option.dist = "worksteal"
