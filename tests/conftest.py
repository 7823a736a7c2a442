"""Test configuration: float64 everywhere and strict dtype promotion, so an accidental
float32/float64 or int/float mix in the library is an error rather than a silent cast."""

import os
import shutil
import subprocess
import sys
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


# XLA:CPU's classic elemental emitters instead of its fusion emitters. The suite is
# compile-bound (about four fifths of its time is JAX tracing and XLA compiling), and XLA
# compiles a solve in about half the time with them (Lotka-Volterra's gradient 0.69 s
# against 1.41 s): the suite took 6 min 9 s against 9 min 22 s on 2 cores. Its values
# do not depend on the emitter (every test passes on either; a reference solved by
# Diffrax in the same process is compiled the same way), but the structure of a compiled
# program does: a test that reads it compiles in a child process on the default
# emitters. `.ci/run` runs its newest-JAX subset on the default emitters
# (ODESOLVE_TEST_DEFAULT_EMITTERS=1), and a caller's own setting of the flag is kept.
_EMITTERS = "--xla_cpu_use_fusion_emitters=false"
_DEFAULT_EMITTERS = "ODESOLVE_TEST_DEFAULT_EMITTERS"


def _compile_with_classic_emitters() -> None:
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_use_fusion_emitters" in flags or os.environ.get(_DEFAULT_EMITTERS):
        return
    # An XLA that does not know the flag aborts at start: ask a child process first.
    probe = "import jax; jax.jit(lambda x: x + 1)(1.0).block_until_ready()"
    env = dict(os.environ, XLA_FLAGS=f"{flags} {_EMITTERS}".strip(), JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True)
    if done.returncode == 0:
        os.environ["XLA_FLAGS"] = env["XLA_FLAGS"]


def pytest_configure(config: pytest.Config) -> None:
    """The classic emitters (above), and the compilation cache. Workers compile many of
    the same programs (a solve of a test problem under the same options): one cache for
    the run lets a worker load what another has compiled (about 8% of the suite's time
    on 2 cores). A cache the caller set is used as it is and left in place."""
    if not hasattr(config, "workerinput"):
        _compile_with_classic_emitters()  # inherited by the workers
    if not hasattr(config, "workerinput") and _CACHE not in os.environ:
        os.environ[_CACHE] = tempfile.mkdtemp(prefix="odesolve-tests-jax-cache-")
        os.environ[_CACHE_OWNED] = "1"
    jax.config.update("jax_compilation_cache_dir", os.environ[_CACHE])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and os.environ.pop(_CACHE_OWNED, None):
        shutil.rmtree(os.environ.pop(_CACHE), ignore_errors=True)
