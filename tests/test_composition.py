"""Gradients under every composition of JAX transformations, for every adjoint and every
checkpoint schedule, against `DirectAdjoint` applied one sample at a time.

The factors and their values are registries in `composition.py`. The suite runs a
covering subset: every pair of factor values that a valid case can hold appears in at
least one case. `pytest -m matrix` runs the whole product instead.
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
)

REFERENCES = References()


def _check(case):
    adjoint = ADJOINTS[case.adjoint]
    problem = Problem(case.field, case.params, case.controller, adjoint.needs_fixed)
    transformation = TRANSFORMATIONS[case.transformation]
    actual = transformation.run(problem, adjoint.make())
    expected = REFERENCES.get(problem, case.transformation)
    assert relative_error(actual, expected) <= adjoint.rtol


@pytest.mark.parametrize("case", covering_cases(), ids=lambda c: c.id)
def test_gradient_composition(case):
    _check(case)


_COVERED = {c.id for c in covering_cases()}


@pytest.mark.matrix
@pytest.mark.parametrize(
    "case", [c for c in all_cases() if c.id not in _COVERED], ids=lambda c: c.id
)
def test_gradient_composition_full(case):
    _check(case)
