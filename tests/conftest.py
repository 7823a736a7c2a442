"""Test configuration: float64 everywhere and strict dtype promotion, so an accidental
float32/float64 or int/float mix in the library is an error rather than a silent cast."""

import os
import shutil
import tempfile

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


# The run's compilation cache, shared by its workers: created by the process that starts
# them, removed when it ends.
_CACHE = "JAX_COMPILATION_CACHE_DIR"
_CACHE_OWNED = "ODESOLVE_TEST_OWNS_JAX_CACHE"


def pytest_configure(config: pytest.Config) -> None:
    """Workers compile many of the same programs (a solve of a test problem under the
    same options): one compilation cache for the run lets a worker load what another has
    compiled (about 8% of the suite's time on 2 cores). A cache the caller set is used
    as it is and left in place."""
    if not hasattr(config, "workerinput") and _CACHE not in os.environ:
        os.environ[_CACHE] = tempfile.mkdtemp(prefix="odesolve-tests-jax-cache-")
        os.environ[_CACHE_OWNED] = "1"
    jax.config.update("jax_compilation_cache_dir", os.environ[_CACHE])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and os.environ.pop(_CACHE_OWNED, None):
        shutil.rmtree(os.environ.pop(_CACHE), ignore_errors=True)
