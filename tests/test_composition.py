"""Gradients under every composition of JAX transformations, for every adjoint and every
checkpoint schedule, against forward mode applied one sample at a time.

The factors and their values are registries in `composition.py`. Three sets of cases:

- the suite: every pair of factor values (outside `HEAVY`) that a valid case can hold
  appears in at least one case;
- `pytest -m matrix`: every pair of all the values, `HEAVY` ones included (about 100
  cases, ten minutes on two cores);
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
    # Forward over reverse through the `lax.switch` field with adaptive steps differs
    # from the forward-over-forward reference by 3.03e-10 for every adjoint alike
    # (DirectAdjoint, JAX's own differentiation of a scan, included; they agree with
    # each other to 1e-15): a property of the two orders of differentiation of the
    # same program, not of an adjoint.
    if case.transformation == "jvp(grad)" and case.field == "switch":
        return max(rtol, 1e-9)
    return rtol


_SUITE = covering_cases(light=True) + reversible_cases()
_PAIRS = [c for c in covering_cases() if c not in _SUITE]
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
