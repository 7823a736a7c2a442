"""Checkpoint schedules: the binomial rule against a brute-force optimum, the online slot
table, and the exact recomputation order of the reverse sweep, observed through the vector
field (as equinox's tests/test_while_loop.py does for its checkpointed while loop).

Ticks are numbered from 0; "the state before tick k" is the carry the k-th step starts
from. In the vector-field logs below, a tick of `Euler` evaluates the field exactly once,
at the time the step starts, whether it runs forwards or inside a vector-Jacobian product.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import equations, record_schedule_choices

import odesolve as ode
from adjoints._adjoint import least_states
from adjoints._loop import Loop
from adjoints._schedule import (
    Nested,
    Online,
    Segments,
    States,
    Tape,
    forward_steps,
    next_checkpoint,
)
from adjoints._schedule.nested import _bytes, _smallest
from adjoints._slot_table import SlotTable
from adjoints._work import operations

# ------------------------------------------------------------------ binomial rule


@functools.cache
def optimal_recomputations(ticks: int, free: int) -> int:
    """Fewest forward ticks recomputed to reverse `ticks` ticks from one stored state with
    `free` further slots (Griewank's recursion, by exhaustive dynamic programming): advance
    m ticks and store, reverse the last ticks - m with one slot fewer, then the first m."""
    if ticks == 1:
        return 0
    if free == 0:
        return ticks * (ticks - 1) // 2
    return min(
        m + optimal_recomputations(ticks - m, free - 1) + optimal_recomputations(m, free)
        for m in range(1, ticks)
    )


def test_next_checkpoint_python_and_traced_agree():
    grid = [
        (base, base + ticks - 1, free)
        for base in (0, 1, 7, 1000)
        for ticks in range(2, 90)
        for free in range(1, 8)
    ]
    python = np.array([next_checkpoint(b, t, f) for b, t, f in grid])
    base, target, free = (jnp.array(col, jnp.int32) for col in zip(*grid))
    traced = jax.jit(jax.vmap(next_checkpoint))(base, target, free)
    assert traced.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(traced), python)


def test_next_checkpoint_is_an_optimal_split():
    # The reverse sweep clips the choice to (base, target] (for two ticks the rule says
    # `base`); after that clip, splitting there must cost no more than the optimum.
    for ticks, free in itertools.product(range(2, 60), range(1, 6)):
        base = 3
        target = base + ticks - 1
        m = min(max(next_checkpoint(base, target, free), base + 1), target) - base
        cost = m + optimal_recomputations(ticks - m, free - 1) + optimal_recomputations(m, free)
        assert cost == optimal_recomputations(ticks, free), (ticks, free, m)


def test_forward_steps_is_the_optimum():
    for n, slots in itertools.product(range(1, 41), range(1, 7)):
        assert forward_steps(n, slots) == optimal_recomputations(n, slots - 1), (n, slots)


def test_forward_steps_table_values():
    assert forward_steps(1000, 10) == 3636
    assert forward_steps(4096, 20) == 14360


# ------------------------------------------------------------------ online slot table


@pytest.mark.matrix  # the online schedule's unknown-count case stays in the suite
def test_online_thinning_keeps_multiples_of_the_stride():
    slots = 4
    schedule = Online(slots=slots)
    state = schedule.init()
    table = SlotTable.empty(slots)
    thinnings = 0
    for k in range(41):
        old_stride = int(state[0])
        due, slot, table, state = schedule.store(jnp.int32(k), state, table)
        stride = state[0]
        assert int(state[1]) == int(jnp.sum(table.ticks < 0)) - int(due)  # free, counted
        if int(stride) != old_stride:  # a thinning happened at this tick
            thinnings += 1
            assert int(stride) == 2 * old_stride
            kept = [int(x) for x in table.ticks if x >= 0]
            assert all(x % int(stride) == 0 for x in kept), (k, kept)
        if bool(due):
            assert int(table.ticks[slot]) == -1, "stored over a live slot"
            table = table.holding(slot, jnp.int32(k), True)
        kept = sorted(int(x) for x in table.ticks if x >= 0)
        # The stack: the slots in use first, in the order of their ticks.
        stack = [int(table.ticks[i]) for i in table.order[: len(kept)]]
        assert stack == kept, (k, stack)
        assert len(kept) <= slots
        assert kept[0] == 0
        # Exactly the multiples of the stride seen so far are held.
        assert kept == list(range(0, k + 1, int(stride))), (k, kept, int(stride))
    assert thinnings == 4  # strides 2, 4, 8, 16
    # The docstring's spacing: n/slots <= stride <= 2n/slots after n = 41 ticks.
    assert 41 / slots <= int(stride) <= 2 * 41 / slots


def online_positions(n: int, slots: int) -> list[int]:
    """States the online schedule holds after n ticks (driving `Online.store`)."""
    schedule = Online(slots=slots)
    state, table = schedule.init(), SlotTable.empty(slots)
    for k in range(n):
        due, slot, table, state = schedule.store(jnp.int32(k), state, table)
        if bool(due):
            table = table.holding(slot, jnp.int32(k), True)
    return sorted(int(x) for x in table.ticks if x >= 0)


def online_reverse_evaluations(n: int, slots: int) -> int:
    """Reverse-sweep ticks the Online docstring promises: the last tick is reversed from
    the state the forward sweep kept (1 tick), then each gap between held states is
    reversed by the binomial rule with the slots then free (those of later gaps are
    released): g reversed ticks plus forward_steps(g, free + 1) recomputed."""
    held = online_positions(n, slots)
    total = 1
    for start, end in zip(held, held[1:] + [n - 1]):
        gap = end - start
        free = slots - sum(1 for p in held if p <= start)
        total += gap + forward_steps(gap, free + 1)
    return total


# ------------------------------------------------------- recomputation order, observed


def euler_gradient_log(n, adjoint, traced_t1=False, save_ts=None):
    """d y(1)/d a for y' = -a y, y(0) = 1, n Euler steps, and the times at which the
    vector field was evaluated while computing it (in order). `save_ts`: save times,
    ending at 1, instead of y(1) alone."""
    log = []

    def field(t, y, a):
        jax.debug.callback(lambda s: log.append(float(s)), t, ordered=True)
        return -a * y

    def final(a, t1):
        sol = ode.diffeqsolve(
            ode.ODETerm(field),
            ode.Euler(),
            0.0,
            t1,
            1.0 / n,
            jnp.asarray(1.0),
            a,
            stepsize_controller=ode.ConstantStepSize(),
            saveat=ode.SaveAt(t1=True) if save_ts is None else ode.SaveAt(ts=save_ts),
            max_steps=n,
            adjoint=adjoint,
        )
        return sol.ys[-1]

    a = jnp.asarray(0.7)
    if traced_t1:
        # t1 traced: the number of steps is unknown at trace time, so no offline schedule.
        grad = jax.jit(jax.grad(final))(a, jnp.asarray(1.0))
    else:
        grad = jax.grad(final)(a, 1.0)
    jax.effects_barrier()
    exact = -((1 - 0.7 / n) ** (n - 1))  # y_n = (1 - a/n)^n exactly for Euler
    np.testing.assert_allclose(float(grad), exact, rtol=1e-13)
    return np.asarray(log)


def split_log(log, n):
    """(initial derivative, forward sweep, reverse sweep), checking the first two."""
    grid = np.arange(n) / n
    np.testing.assert_allclose(log[:1], [0.0], atol=1e-15)
    np.testing.assert_allclose(log[1 : n + 1], grid, atol=1e-12)
    reverse = log[n + 1 :]
    # Every reverse-sweep evaluation starts a step on the grid; the last reverses tick 0.
    assert np.all(np.min(np.abs(reverse[:, None] - grid[None]), axis=1) < 1e-12)
    assert abs(reverse[-1]) < 1e-15
    return reverse


def test_revolve_two_slots_exact_order():
    # 5 ticks, 2 slots: the forward sweep keeps the states before ticks 0 and 2 (revolve's
    # choice) and the one before tick 4. Reverse: tick 4 (kept); tick 3 from 2 (advance
    # 2, reverse 3); tick 2 (held); tick 1 from 0 (advance 0, reverse 1); tick 0.
    reverse = split_log(euler_gradient_log(5, ode.RecursiveCheckpointAdjoint(checkpoints=2)), 5)
    np.testing.assert_allclose(reverse, [0.8, 0.4, 0.6, 0.4, 0.0, 0.2, 0.0], atol=1e-12)


@pytest.mark.parametrize(
    "adjoint",
    [
        ode.RecursiveCheckpointAdjoint(),
        ode.RecursiveCheckpointAdjoint(checkpoints=5),
    ],
    ids=["default", "checkpoints=n"],
)
def test_taping_recomputes_nothing(adjoint):
    # Taping stores each step's residuals: the reverse sweep applies the transposed steps
    # and evaluates no step again (and, this field being linear in y, not even the field:
    # its linearisation needs only the stage inputs already on the tape).
    n = 5
    log = euler_gradient_log(n, adjoint)
    np.testing.assert_allclose(log, np.concatenate([[0.0], np.arange(n) / n]), atol=1e-12)


@pytest.mark.parametrize("n, slots", [(10, 3), (30, 3), (50, 5)])
def test_revolve_recomputes_the_optimal_number_of_ticks(n, slots):
    reverse = split_log(euler_gradient_log(n, ode.RecursiveCheckpointAdjoint(checkpoints=slots)), n)
    # n reversed ticks, plus the optimum recomputed, less the n - 1 ticks the forward
    # sweep already advanced from the last stored state (kept for the first reversal).
    assert len(reverse) == n + forward_steps(n, slots) - (n - 1)
    # Every tick is reversed, the latest first: its last evaluation in the sweep is in
    # order n-1, ..., 0 (later evaluations of tick k would be recomputations after it).
    last_seen = {round(t * n): i for i, t in enumerate(reverse)}
    assert sorted(last_seen, key=last_seen.get) == list(range(n - 1, -1, -1))


def test_known_step_count_under_jit_uses_revolve():
    # Concrete t0, t1 and dt0 inside a jitted gradient: the step count is still known at
    # trace time (a converted Python number is a tracer under jit; it is read before), so
    # the offline schedule's optimum applies, not the online one's.
    n, slots = 10, 3
    log = []

    def field(t, y, a):
        jax.debug.callback(lambda s: log.append(float(s)), t, ordered=True)
        return -a * y

    def final(a):
        sol = ode.diffeqsolve(
            ode.ODETerm(field),
            ode.Euler(),
            0.0,
            1.0,
            1.0 / n,
            jnp.asarray(1.0),
            a,
            max_steps=n,
            adjoint=ode.RecursiveCheckpointAdjoint(checkpoints=slots),
        )
        return sol.ys[-1]

    grad = jax.jit(jax.grad(final))(jnp.asarray(0.7))
    jax.effects_barrier()
    np.testing.assert_allclose(float(grad), -((1 - 0.7 / n) ** (n - 1)), rtol=1e-13)
    reverse = split_log(np.asarray(log), n)
    assert len(reverse) == n + forward_steps(n, slots) - (n - 1)


def test_fixed_steps_between_save_times_are_bounded_by_their_count(monkeypatch):
    # Constant steps with concrete times, saved at traced times inside a gradient: the
    # loop takes its 50 steps and 11 saves, whatever max_steps is. The default sizes its
    # schedule by those 61 ticks (a tape of them in 64 KiB, where a bound of 4,107 would
    # not fit), and DirectAdjoint's scans run those ticks, not max_steps.
    chosen = record_schedule_choices(monkeypatch)
    w = jax.random.normal(jax.random.key(0), (8, 8)) / 3

    def loss(w, adjoint):
        sol = ode.diffeqsolve(
            ode.ODETerm(lambda t, y, w: jnp.tanh(w @ y)), ode.Heun(), 0.0, 1.0, 0.02,
            jnp.linspace(-1.0, 1.0, 8), w, saveat=ode.SaveAt(ts=jnp.linspace(0.0, 1.0, 11)),
            adjoint=adjoint,
        )  # fmt: skip
        return jnp.mean(sol.ys**2)

    budget = ode.RecursiveCheckpointAdjoint(memory_budget=2**16)
    jax.make_jaxpr(jax.grad(loss), static_argnums=1)(w, budget)  # traced, not compiled
    assert [c.schedule for c in chosen] == [Tape(61)]
    jaxpr = jax.make_jaxpr(jax.grad(loss), static_argnums=1)(w, ode.DirectAdjoint())
    scans = [e.params["length"] for e in equations(jaxpr) if e.primitive.name == "scan"]
    assert scans and max(scans) < 61
    # (The gradients of such tapes: the two tests below.)


def test_fixed_steps_saved_at_every_step_are_bounded_by_their_count(monkeypatch):
    # 20 constant steps, each saved (`SaveAt(steps=True)`: an emit a step), max_steps
    # 4,096: 40 ticks to tape, not 8,192; the gradient is the exact solution's, to the
    # solver's error.
    chosen = record_schedule_choices(monkeypatch)

    def loss(k, adjoint):
        sol = ode.diffeqsolve(
            ode.ODETerm(lambda t, y, k: -k * y), ode.Tsit5(), 0.0, 2.0, 0.1, jnp.ones(2), k,
            saveat=ode.SaveAt(steps=True), adjoint=adjoint,
        )  # fmt: skip
        return jnp.sum(jnp.where(jnp.isfinite(sol.ys), sol.ys, 0.0) ** 2)

    k = jnp.array([0.5, 2.0])
    grad = jax.grad(loss)(k, ode.RecursiveCheckpointAdjoint())
    assert [c.schedule for c in chosen] == [Tape(40)]
    ts = 0.1 * np.arange(1, 21)  # the saved steps' ends: y = exp(-k t)
    exact = [np.sum(-2 * ts * np.exp(-2 * c * ts)) for c in (0.5, 2.0)]
    np.testing.assert_allclose(grad, exact, rtol=1e-5)


@pytest.mark.parametrize("direction", [1, pytest.param(-1, marks=pytest.mark.matrix)])
def test_the_step_count_known_when_traced_is_the_one_the_loop_takes(direction):
    # Float32 times where float64 arithmetic counts one step fewer or more than the loop
    # takes: the count the adjoints size their tape by must be the loop's, or a step
    # would go untaped. The first: 101 steps (float64 says 100), and the gradient of the
    # default adjoint is the exact one of the 101 Euler steps taken.
    cases = [
        (1.3298255745511582, 2.3298255745511582, 0.01),
        (3.4209462101655994, 3.7209462101655992, 0.1),
        (4.744734180429861, 4.864734180429861, 0.01),
        (3.339804512190236, 9.699804512190237, 0.06),
    ]
    f32 = lambda x: jnp.asarray(direction * x, jnp.float32)

    def loss(k, t0, t1, dt0):
        sol = ode.diffeqsolve(
            ode.ODETerm(lambda t, y, k: -k * y), ode.Euler(), f32(t0), f32(t1), f32(dt0),
            jnp.ones(1, jnp.float32), k,
        )  # fmt: skip
        return jnp.sum(sol.ys**2), sol.stats["num_steps"]

    for t0, t1, dt0 in cases:
        counted = ode.ConstantStepSize().num_steps(f32(t0), f32(t1), f32(dt0), jnp.float32)
        taken = loss(jnp.float32(0.7), t0, t1, dt0)[1]
        assert counted == int(taken), (t0, t1, dt0)
    dt = direction * np.float32(1.0) / 101  # the first case's steps: y -> (1 - 0.7 dt) y
    exact = 2 * 101 * -dt * (1 - 0.7 * dt) ** (2 * 101 - 1)
    grad, _ = jax.grad(loss, has_aux=True)(jnp.float32(0.7), *cases[0])
    np.testing.assert_allclose(grad, exact, rtol=1e-5)


def test_online_schedule_when_the_step_count_is_unknown():
    n, slots = 10, 3
    reverse = split_log(
        euler_gradient_log(n, ode.RecursiveCheckpointAdjoint(checkpoints=slots), traced_t1=True),
        n,
    )
    # Derivation by hand for n = 10, 3 slots: the stride doubles at tick 3 (releasing 1)
    # and at tick 6 (releasing 2), so the states before ticks 0, 4 and 8 are held, plus the
    # one before tick 9 kept for the first reversal. Tick 9: 1 evaluation. Tick 8: 1.
    # Ticks 4..7 with 1 free slot: revolve stores 5 (4 + b4), so 4, 5, 6 advance, 7
    # reverses; 5 advances, 6 reverses; 5, 4 reverse: 8. Ticks 0..3 with 2 free slots:
    # 0, 1, 2 advance (storing 1 and 2), 3, 2, 1, 0 reverse: 7. Total 17.
    expected = [0.9, 0.8, 0.4, 0.5, 0.6, 0.7, 0.5, 0.6, 0.5, 0.4, 0.0, 0.1, 0.2, 0.3, 0.2, 0.1, 0.0]
    np.testing.assert_allclose(reverse, expected, atol=1e-12)
    assert online_positions(n, slots) == [0, 4, 8]
    assert len(reverse) == online_reverse_evaluations(n, slots) == 17
    # One more than revolve would need with the count known: the schedule is online.
    assert len(reverse) == n + forward_steps(n, slots) - (n - 1) + 1


def test_checkpoints_count_steps_and_each_save_has_its_own_slot():
    """As in Diffrax, `checkpoints` counts states of the step loop: 3 checkpoints hold a
    solve of 3 steps with 6 save times (9 ticks), and the reverse sweep applies
    the residuals kept beside them without evaluating the field (linear in y). With 2,
    the slots thin and steps are evaluated again."""
    log = lambda slots: euler_gradient_log(
        3, ode.RecursiveCheckpointAdjoint(checkpoints=slots), save_ts=jnp.linspace(0, 1, 6)
    )
    forward = [0.0, 0.0, 1 / 3, 2 / 3]  # the initial derivative, then one per step
    np.testing.assert_allclose(log(3), forward, atol=1e-12)
    assert len(log(2)) > len(forward)


@pytest.mark.matrix  # the online schedule's other two checks stay in the suite
def test_online_schedule_recomputation_bound():
    n, slots = 16, 4  # slots = sqrt(n)
    reverse = split_log(
        euler_gradient_log(n, ode.RecursiveCheckpointAdjoint(checkpoints=slots), traced_t1=True),
        n,
    )
    assert len(reverse) == online_reverse_evaluations(n, slots)
    assert len(reverse) <= 3 * n


# ------------------------------------------------------------------ nested segments


@pytest.mark.parametrize(
    "lengths, expected",
    [
        # Segments [8, 9], [4, 7], [0, 3], last first, each run once linearised.
        ((4,), [0.8, 0.9, 0.4, 0.5, 0.6, 0.7, 0.0, 0.1, 0.2, 0.3]),
        # Each segment of 4 run bare keeping the state before its second half (ticks 4
        # and 5 of [4, 7]), then its halves linearised, last first.
        ((4, 2), [0.8, 0.9, 0.4, 0.5, 0.6, 0.7, 0.4, 0.5, 0.0, 0.1, 0.2, 0.3, 0.0, 0.1]),
    ],
    ids=["1-level", "2-level"],
)
def test_nested_segments_exact_order(lengths, expected):
    adjoint = ode.RecursiveCheckpointAdjoint(schedule=ode.Nested(lengths=lengths))
    log = euler_gradient_log(10, adjoint)
    # The forward sweep as always; the reverse sweep's last evaluation is not tick 0's
    # (a segment is linearised forwards, then reversed without evaluations).
    np.testing.assert_allclose(log[: 10 + 1], np.concatenate([[0.0], np.arange(10) / 10]))
    np.testing.assert_allclose(log[10 + 1 :], expected, atol=1e-12)


def test_nested_segments_under_vmap_read_each_samples_own_tape_row():
    # A row read at an index the samples share is a slice that XLA:CPU fuses into every
    # kernel using it (the per-sample weight cotangents of an MLP field, 10 times slower
    # a tick); each sample's own index is read once.
    samples, length = 3, 3  # 10 steps: 4 kept states, 3 taped rows
    weights = jnp.linspace(0.5, 1.5, 6).reshape(2, 3)
    adjoint = ode.RecursiveCheckpointAdjoint(schedule=ode.Nested(lengths=(length,)))

    def loss(w, y0):
        term = ode.ODETerm(lambda t, y, w: jnp.tanh(w @ jnp.concatenate([y, y[:1]])))
        sol = ode.diffeqsolve(term, ode.Euler(), 0.0, 1.0, 0.1, y0, args=w, adjoint=adjoint)
        return jnp.sum(sol.ys**2)

    y0s = jnp.linspace(0.1, 0.6, 2 * samples).reshape(samples, 2)
    batched = jax.grad(lambda w: jnp.sum(jax.vmap(lambda y: loss(w, y))(y0s)))
    # The tape: a float block of `length` rows for each sample.
    is_tape = lambda v: v.aval.ndim == 3 and v.aval.shape[:2] == (samples, length)
    reads = [
        eqn.invars[1].aval.shape
        for eqn in equations(jax.make_jaxpr(batched)(weights))
        if eqn.primitive.name in ("gather", "dynamic_slice") and is_tape(eqn.invars[0])
    ]
    assert reads and all(shape[:1] == (samples,) for shape in reads)  # an index a sample
    one_by_one = sum(jax.grad(loss)(weights, y) for y in y0s)
    np.testing.assert_allclose(batched(weights), one_by_one, rtol=1e-12)


@pytest.mark.parametrize("n", [10, 1_000, 100_000, 10_000_000])
@pytest.mark.parametrize("budget", [2_000, 16_000, 200_000])
def test_nested_fit_uses_the_fewest_levels_that_fit(n, budget):
    state, row = 84, 392  # bytes of a Tsit5 state and taped step in float64, 2 states
    nested = Nested.fit(n, state, row, budget)
    for fewer in range(1, len(nested.lengths) if nested else 4):
        best = _smallest(n, fewer, state, row)
        assert best is None or _bytes(n, best, state, row) > budget
    if nested is None:
        return
    lengths = nested.lengths
    assert _bytes(n, lengths, state, row) <= budget
    assert nested.slots * lengths[0] >= n > lengths[0]  # the segments cover the loop
    for level in range(1, len(lengths)):
        assert nested.level_slots(level) * lengths[level] >= lengths[level - 1] > lengths[level]


# ------------------------------------------------------------------ taped segments


@pytest.mark.parametrize("bare", [False, True], ids=["taped", "bare"])
def test_taped_segments_exact_order(bare):
    # t1 traced: the step count is unknown, so segments of 4 ticks over the bound of 10.
    # The last segment, ticks [8, 9], is on the tape when the forward sweep ends; [4, 7]
    # and then [0, 3] are run again from their states, each tick once. Bare, the forward
    # sweep tapes nothing, and [8, 9] is run again first. Reversing a taped tick
    # evaluates nothing (the field is linear in y).
    adjoint = ode.RecursiveCheckpointAdjoint(schedule=ode.Segments(length=4, bare=bare))
    log = euler_gradient_log(10, adjoint, traced_t1=True)
    np.testing.assert_allclose(log[: 10 + 1], np.concatenate([[0.0], np.arange(10) / 10]))
    again = ([0.8, 0.9] if bare else []) + [0.4, 0.5, 0.6, 0.7, 0.0, 0.1, 0.2, 0.3]
    np.testing.assert_allclose(log[10 + 1 :], again, atol=1e-12)


def test_thinned_segments_exact_order():
    # Segments of 2 ticks, at most 2 states kept: before segments 0 and 1, then (the
    # stride doubling at segment 2) 0 and 2, then 0 and 4. The last segment, [8, 9], is
    # on the tape; each earlier one is run again from tick 0, bare up to its first tick,
    # then linearised.
    adjoint = ode.RecursiveCheckpointAdjoint(schedule=ode.Segments(length=2, starts=2))
    log = euler_gradient_log(10, adjoint, traced_t1=True)
    np.testing.assert_allclose(log[: 10 + 1], np.concatenate([[0.0], np.arange(10) / 10]))
    runs = [np.arange(end) / 10 for end in (8, 6, 4, 2)]
    np.testing.assert_allclose(log[10 + 1 :], np.concatenate(runs), atol=1e-12)


@pytest.mark.parametrize("slots", [None, 4], ids=["every-state", "thinned"])
def test_bare_states_exact_order(slots):
    # Bare states: the forward sweep stores states, no residuals. With a slot for every
    # tick, each tick is reversed by its VJP from its own state: one evaluation each, last
    # first, and nothing run forwards again. With 4 slots (after thinning: ticks 0, 4, 8),
    # ticks between kept states are run forwards again (Griewank's rule for the gaps).
    adjoint = ode.RecursiveCheckpointAdjoint(checkpoints=slots, schedule="states")
    log = euler_gradient_log(10, adjoint, traced_t1=True)
    np.testing.assert_allclose(log[: 10 + 1], np.concatenate([[0.0], np.arange(10) / 10]))
    reverse = log[10 + 1 :]
    if slots is None:
        np.testing.assert_allclose(reverse, np.arange(9, -1, -1) / 10, atol=1e-12)
    else:
        assert 10 < len(reverse) <= 3 * 10


@pytest.mark.parametrize("n", [10, 4_096, 100_000])
@pytest.mark.parametrize("budget", [2_000, 16_000, 4 * 2**20])
def test_segments_fit_takes_the_longest_segments_that_fit(n, budget):
    state, row = 84, 392
    segments = Segments.fit(n, state, row, budget)
    fits = lambda length: Segments.memory(length, n, state, row) <= budget
    if segments is None:  # nothing from 2 ticks to a whole tape fits
        assert not any(fits(length) for length in range(2, n))
        return
    length = segments.length
    assert 2 <= length < n
    if segments.starts is not None:  # thinned: a fixed number of states, the tape longer
        assert segments.slots * length < n
        assert (length + 1) * row + (segments.starts + 1) * state <= budget
        assert length >= max((k for k in range(2, min(n, 2_000)) if fits(k)), default=0)
        return
    assert fits(length)
    assert segments.slots * length >= n  # the segments cover the bound
    assert not any(fits(longer) for longer in range(length + 1, min(n, length + 2_000)))


def _adaptive_loop() -> Loop:
    """A loop as an adaptive solve hands it over: its step count unknown, `max_steps`
    4096 and 20 output times. Only its shape matters to a schedule."""
    unused = lambda *_: None
    return Loop(unused, unused, unused, unused, 4096, 20)


def test_a_batch_of_short_solves_tapes_them_whatever_max_steps():
    # A latent ODE's decoder: 256 series under vmap, a state of 692 bytes, traced save
    # times (the step count unknown), about 8 steps and 20 saves each. The default tapes
    # more than those 28 ticks in one segment beside 8 states, and neither the tape nor
    # the states grow with max_steps.
    state = jnp.zeros(173, jnp.float32)
    default = ode.RecursiveCheckpointAdjoint()
    unused = lambda *_: None
    chosen = []
    for max_steps in (4096, 2**20):
        loop = Loop(unused, unused, unused, unused, max_steps, 20)
        chosen.append(default.choose_schedule(loop, state, batch_size=256))
    assert all(isinstance(c, Segments) and c.starts == 8 for c in chosen)
    assert chosen[0].length == chosen[1].length >= 28
    assert Segments.memory(chosen[0].length, 8 * chosen[0].length, 692, 692) <= 32 * 2**10


def test_the_default_budget_keeps_each_samples_share_in_a_large_batch():
    # A state of 120 bytes: 32 KiB per sample holds taped segments of the bound; the
    # default's least share is less, the room for segments of 64 ticks beside 8 states
    # (8,880 bytes), as 32 KiB would be hundreds of rows of such a state; 4 KiB (4 MiB
    # shared by 1024 samples) holds a tape of 24 ticks beside 8 states thinned as the
    # solve runs, whatever max_steps; 1 KiB only online slots.
    state = jnp.zeros(30, jnp.float32)
    default = ode.RecursiveCheckpointAdjoint()
    assert default.budget_per_solve(1) == 4 * 2**20
    assert default.budget_per_solve(128) == default.budget_per_solve(4096) == 32 * 2**10
    assert default.budget_per_solve(1024, enough=8880) == 8880
    assert default.budget_per_solve(256, enough=8880) == 16 * 2**10
    for batch in (256, 1024, 4096):
        chosen = default.choose_schedule(_adaptive_loop(), state, batch_size=batch)
        assert isinstance(chosen, Segments)
        assert chosen.length == (64 if batch > 256 else 126)
    # A budget the caller sets is shared by the batch, however large.
    explicit = ode.RecursiveCheckpointAdjoint(memory_budget=4 * 2**20)
    assert explicit.budget_per_solve(1024) == 4 * 2**10
    thinned = explicit.choose_schedule(_adaptive_loop(), state, batch_size=1024)
    assert thinned == Segments(24, 4116, 8)
    small = ode.RecursiveCheckpointAdjoint(memory_budget=2**20)
    assert isinstance(small.choose_schedule(_adaptive_loop(), state, batch_size=1024), Online)


def test_a_large_state_keeps_bare_states_and_never_fewer_than_log2_of_the_bound():
    # A discretised field saved at given times carries its dense output: a state of
    # 1.6 MB. The default keeps log2(4116) + 1 = 14 of them (4 MiB would hold two,
    # recomputed quadratically), bare: tape rows of 64 KiB or more are not taped.
    default = ode.RecursiveCheckpointAdjoint()
    large = jnp.zeros(400_000, jnp.float32)
    assert least_states(4116) == 14
    assert default.choose_schedule(_adaptive_loop(), large) == States(14)
    # 160 KB: as many, bare rather than 16 taped rows: the default keeps little for the
    # reverse sweep of a solve of unknown length, whatever its budget would hold.
    assert default.choose_schedule(_adaptive_loop(), jnp.zeros(40_000, jnp.float32)) == States(14)
    # A budget the caller sets is kept, however large the state: 4 MiB holds 26 of these.
    budget = ode.RecursiveCheckpointAdjoint(memory_budget=4 * 2**20)
    assert budget.choose_schedule(_adaptive_loop(), jnp.zeros(40_000, jnp.float32)) == States(26)
    assert budget.choose_schedule(_adaptive_loop(), large) == States(2)
    # Rows under 64 KiB are taped in segments as before.
    chosen = default.choose_schedule(_adaptive_loop(), jnp.zeros(4_000, jnp.float32))
    assert isinstance(chosen, Segments)


def _diffusion_gradient(field, y0, args, batch: int | None = None, max_steps: int = 100_000):
    def loss(args, y0):
        sol = ode.diffeqsolve(
            ode.ODETerm(field), ode.Tsit5(), 0.0, 0.1, 1e-4, y0, args,
            stepsize_controller=ode.PIDController(rtol=1e-6, atol=1e-8),
            saveat=ode.SaveAt(ts=jnp.linspace(0.0, 0.1, 11)), max_steps=max_steps,
        )  # fmt: skip
        return jnp.sum(sol.ys**2)

    if batch is not None:
        y0 = y0 * jnp.linspace(0.5, 1.0, batch)[:, None]
        single = loss
        loss = lambda args, y0s: jnp.sum(jax.vmap(lambda y0: single(args, y0))(y0s))
    jax.jit(jax.grad(loss)).lower(args, y0)  # traced, not compiled


@pytest.mark.matrix  # 8 s of compiles: the rule's thresholds, checked before a release
def test_a_cheap_step_on_a_large_state_keeps_bare_states_unless_its_segments_stay_long(monkeypatch):
    # A reaction-diffusion field on 200 points: 10 KB rows (its stages' inputs; an
    # emit's row holds less) for 3.6 operations a byte. Recomputing a step from its state
    # is cheaper than writing and reading back its row (benchmarks/README.md): bare
    # states. Under vmap, a batch of 4 shares the budget but still tapes segments of
    # over SHORT_SEGMENT_TICKS ticks, and keeps them; a batch of 64 whose share is the
    # least for a bound of 4,096 steps (13 states) would tape 6 ticks a segment, and keeps
    # bare states. An MLP field, whose row costs 39 operations a byte, keeps taped
    # segments.
    chosen = record_schedule_choices(monkeypatch)
    x = jnp.linspace(0.0, 1.0, 200)

    def diffusion(t, y, args):
        return args * (jnp.roll(y, 1) - 2 * y + jnp.roll(y, -1)) + y * (1 - y)

    _diffusion_gradient(diffusion, jnp.exp(-100 * (x - 0.5) ** 2), jnp.asarray(1.0))
    assert isinstance(chosen[-1].schedule, States)
    # Each holds the budget's worth of states kept before a step: y and the derivative
    # the next step starts from (2 x 200 float64) and a few scalars, a fifth of a carry.
    assert 4 * 2**20 // chosen[-1].schedule.slots < 2 * 200 * 8 + 256
    _diffusion_gradient(diffusion, jnp.exp(-100 * (x - 0.5) ** 2), jnp.asarray(1.0), batch=4)
    assert isinstance(chosen[-1].schedule, Segments)
    _diffusion_gradient(
        diffusion, jnp.exp(-100 * (x - 0.5) ** 2), jnp.asarray(1.0), batch=64, max_steps=4096
    )
    assert isinstance(chosen[-1].schedule, States)
    keys = jax.random.split(jax.random.key(0), 2)
    weights = (jax.random.normal(keys[0], (128, 32)), jax.random.normal(keys[1], (32, 128)))
    mlp = lambda t, y, w: w[1] @ jnp.tanh(w[0] @ y) / 128
    _diffusion_gradient(mlp, jnp.ones(32), weights)
    assert isinstance(chosen[-1].schedule, Segments)


def test_operations_count_products_by_their_depth_and_the_rest_by_element():
    jaxpr = lambda f, *xs: jax.make_jaxpr(f)(*xs).jaxpr
    a, v = jnp.ones((8, 16)), jnp.ones(16)
    assert operations(jaxpr(lambda a, v: a @ v, a, v)) == 2 * 8 * 16
    assert operations(jaxpr(lambda v: jnp.sin(v) * v, v)) == 2 * 16
    # A branch counts its dearest branch; a scan its body times its length.
    branch = lambda p, v: jax.lax.cond(p, lambda v: v * v * v, lambda v: v, v)
    assert operations(jaxpr(branch, True, v)) == 2 * 16 + 1  # and the predicate's cast
    looped = lambda v: jax.lax.scan(lambda c, _: (c * 2.0, None), v, length=5)[0]
    assert operations(jaxpr(looped, v)) == 5 * 16


_X50 = jnp.linspace(0.0, 1.0, 50)
_PDE_Y0 = jnp.exp(-100 * (_X50 - 0.5) ** 2)


def _pde_end(rates, adjoint=None):
    """y(t1) of a reaction-diffusion field on 50 points (4 KB rows, 2.3 operations a
    byte): the default adjoint keeps bare states for it unbatched."""

    def field(t, y, args):
        d, r = args
        return d * (jnp.roll(y, 1) - 2 * y + jnp.roll(y, -1)) + r * y * (1 - y)

    sol = ode.diffeqsolve(
        ode.ODETerm(field), ode.Tsit5(), 0.0, 0.05, 1e-3, _PDE_Y0, rates,
        stepsize_controller=ode.PIDController(rtol=1e-6, atol=1e-8),
        saveat=ode.SaveAt(ts=jnp.linspace(0.0, 0.05, 4)), max_steps=100_000,
        adjoint=adjoint or ode.RecursiveCheckpointAdjoint(),
    )  # fmt: skip
    return jnp.sum(sol.ys**2, axis=1)


@pytest.mark.matrix  # heavy: runs with -m matrix
@pytest.mark.parametrize(
    "order",
    [
        "jit(grad)",
        *(
            pytest.param(o, marks=pytest.mark.matrix)
            for o in (
                "vmap(grad) batched",
                "grad(vmap) shared",
                "jacrev",
                "jit(jvp)",
                "vmap(vmap(grad))",
            )
        ),
    ],  # fmt: skip
)
def test_bare_states_of_a_cheap_step_differentiate_in_every_order(order, monkeypatch):
    # Against forward mode through the plain loop, one sample at a time.
    chosen = record_schedule_choices(monkeypatch)
    rates = jnp.array([40.0, 1.0])
    batch = rates * jnp.array([[1.0], [0.8], [1.2]])
    forward = lambda r: _pde_end(r, ode.ForwardMode())
    jac = lambda r: jax.jacfwd(forward)(r)  # (4 save times, 2 rates)
    loss = lambda r: jnp.sum(_pde_end(r))
    if order == "jit(grad)":
        got, want = jax.jit(jax.grad(loss))(rates), jnp.sum(jac(rates), axis=0)
        assert isinstance(chosen[-1].schedule, States)
    elif order == "vmap(grad) batched":
        got = jax.jit(jax.vmap(jax.grad(loss)))(batch)
        want = jnp.stack([jnp.sum(jac(r), axis=0) for r in batch])
    elif order == "grad(vmap) shared":
        shared = lambda r: jnp.sum(jax.vmap(lambda s: s * _pde_end(r))(jnp.arange(1.0, 4.0)))
        got, want = jax.jit(jax.grad(shared))(rates), 6 * jnp.sum(jac(rates), axis=0)
    elif order == "jacrev":
        got, want = jax.jit(jax.jacrev(_pde_end))(rates), jac(rates)
    elif order == "jit(jvp(grad))":  # forward over reverse (reverse mode alone has no jvp)
        tangent = jnp.array([1.0, -2.0])
        got = jax.jit(lambda r: jax.jvp(jax.grad(loss), (r,), (tangent,))[1])(rates)
        want = jax.hessian(lambda r: jnp.sum(forward(r)))(rates) @ tangent
    else:
        got = jax.jit(jax.vmap(jax.vmap(jax.grad(loss))))(batch[:, None])[:, 0]
        want = jnp.stack([jnp.sum(jac(r), axis=0) for r in batch])
    np.testing.assert_allclose(got, want, rtol=1e-9)
