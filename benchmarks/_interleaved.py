"""Median run times of functions called in turn, so that each sees the same machine."""

import time
from collections.abc import Callable

import jax
import numpy as np


def medians(fns: dict[str, Callable], args, rounds: int) -> tuple[dict, dict[str, float]]:
    """Each function's output (its first, compiling call) and median time in seconds
    over `rounds` rounds, each round calling every function once."""
    out = {name: jax.block_until_ready(fn(args)) for name, fn in fns.items()}
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(args))
            times[name].append(time.perf_counter() - start)
    return out, {name: float(np.median(t)) for name, t in times.items()}
