"""The README's Python snippets run as written, and print what they say they print."""

import contextlib
import io
import pathlib
import re

import jax
import pytest

README = pathlib.Path(__file__).parent.parent / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_snippet_runs_and_prints_what_it_says(index):
    code = SNIPPETS[index]
    if "from flax import nnx" in code:
        pytest.importorskip("flax.nnx")
    printed = io.StringIO()
    # As users run them: JAX's default dtype promotion (the suite sets strict).
    with contextlib.redirect_stdout(printed), jax.numpy_dtype_promotion("standard"):
        exec(compile(code, f"README.md snippet {index}", "exec"), {})
    # `print(x)  # value`: the comment shows what the line prints.
    promised = [c.strip() for c in re.findall(r"^print\(.*\)[ \t]+#(.*)$", code, flags=re.M)]
    lines = [line.strip() for line in printed.getvalue().splitlines()]
    for words in promised:
        assert " ".join(words.split()) in [" ".join(line.split()) for line in lines], (
            words,
            lines,
        )
