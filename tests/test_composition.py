"""Gradients under every composition of JAX transformations, for every adjoint and every
checkpoint schedule, against forward mode applied one sample at a time.

The factors and their values are registries in `composition.py`. Three sets of cases:

- the suite: every factor value (outside `HEAVY`) appears in at least one case, and the
  reversible adjoint's batched reverse sweep in one;
- `pytest -m matrix`: every pair of factor values, `HEAVY` ones included, and the
  reversible adjoint under every batching transformation (about 160 cases);
- `pytest -m full_product`: every valid case (about 4,900: hours on two cores).
"""

import pytest
from composition import (
    ADJOINTS,
    TRANSFORMATIONS,
    Problem,
    References,
    all_cases,
    covering_cases,
    relative_error,
    reversible_cases,
)

REFERENCES = References()


def _check(case):
    adjoint = ADJOINTS[case.adjoint]
    problem = Problem(case.field, case.params, case.controller, adjoint.needs_fixed, adjoint.solver)
    transformation = TRANSFORMATIONS[case.transformation]
    actual = transformation.run(problem, adjoint.make())
    expected = REFERENCES.get(problem, case.transformation)
    assert relative_error(actual, expected) <= _tolerance(case, adjoint.rtol)


def _tolerance(case, rtol):
    # The `lax.switch` field, floor(2 y1) choosing the branch, with adaptive steps: a
    # stage near a branch boundary amplifies rounding differences between differently
    # compiled programs of the same computation to about 3e-10. Measured with
    # DirectAdjoint (JAX's own differentiation of a scan) on module-pid_jump: batched
    # and per-sample differ by 1.0e-10, per-sample and the forward-mode reference by
    # 1.6e-10; forward over reverse differs from forward over forward by 3.03e-10 for
    # every adjoint alike, the adjoints agreeing with each other to 1e-15.
    if case.field == "switch" and case.controller in ("pid", "pid_jump"):
        return max(rtol, 1e-9)
    return rtol


def _slow(case) -> bool:
    # DirectAdjoint under nested `vmap` runs every tick of `max_steps` for every sample
    # (14 s here): the suite covers each of the two in other cases, `-m matrix` the pair.
    return case.adjoint == "direct" and case.transformation == "vmap(vmap(grad))"


_SUITE = covering_cases(light=True, strength=1, avoid=_slow) + reversible_cases()[1:2]
_PAIRS = list(
    dict.fromkeys(
        c
        for c in covering_cases(light=True) + covering_cases() + reversible_cases()
        if c not in _SUITE
    )
)
_REST = set(_SUITE) | set(_PAIRS)


@pytest.mark.parametrize("case", _SUITE, ids=lambda c: c.id)
def test_gradient_composition(case):
    _check(case)


@pytest.mark.matrix
@pytest.mark.parametrize("case", _PAIRS, ids=lambda c: c.id)
def test_gradient_composition_all_pairs(case):
    _check(case)


@pytest.mark.full_product
@pytest.mark.parametrize("case", [c for c in all_cases() if c not in _REST], ids=lambda c: c.id)
def test_gradient_composition_full_product(case):
    _check(case)
