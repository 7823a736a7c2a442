"""The README's Python snippets run as written, in order in one namespace, and print what
they say they print (`print(x)  # value`), as the documentation's do (tests/test_docs.py)."""

import pathlib

import pytest
from test_docs import ENABLES_X64, python_blocks, run_blocks

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_snippets_run_and_print_what_they_say():
    blocks = python_blocks(README.read_text())
    assert blocks, "README.md has no ```python blocks"
    if any("from flax import" in code for code in blocks):
        pytest.importorskip("flax.nnx")
    run_blocks(blocks, "README.md", x64=any(ENABLES_X64 in code for code in blocks))
