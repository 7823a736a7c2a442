"""Every ```python block of the documentation (docs/*.md) runs as written and prints what it
says it prints.

The blocks of one page run in order in one namespace, as a reader pasting them into one
session would run them. They run as users run them: JAX's default dtype promotion (the
suite sets strict), and float32 unless the page itself turns on float64 with
`jax.config.update("jax_enable_x64", True)` (the suite sets float64 for everything else).
A line `print(x)  # text` promises that one printed line is `text` (spaces aside).
"""

import contextlib
import io
import pathlib
import re

import jax
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("**/*.md"))
ENABLES_X64 = 'jax.config.update("jax_enable_x64", True)'


def python_blocks(text: str) -> list[str]:
    """The ```python blocks of a Markdown text, in order."""
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def promised_lines(code: str) -> list[str]:
    """What `print(...)  # text` lines say they print."""
    return [c.strip() for c in re.findall(r"^print\(.*\)[ \t]+#(.*)$", code, flags=re.M)]


def run_blocks(blocks: list[str], name: str, x64: bool) -> None:
    """Run `blocks` in one namespace; check each block prints what its comments promise."""
    namespace: dict = {}
    squeeze = lambda line: " ".join(line.split())
    for index, code in enumerate(blocks):
        printed = io.StringIO()
        with (
            contextlib.redirect_stdout(printed),
            jax.numpy_dtype_promotion("standard"),
            jax.enable_x64(x64),
        ):
            exec(compile(code, f"{name} block {index}", "exec"), namespace)
        lines = [squeeze(line) for line in printed.getvalue().splitlines()]
        for words in promised_lines(code):
            assert squeeze(words) in lines, (f"{name} block {index}", words, lines)


def run_page(path: pathlib.Path) -> None:
    blocks = python_blocks(path.read_text())
    if any("from flax import" in code for code in blocks):
        pytest.importorskip("flax.nnx")
    x64 = any(ENABLES_X64 in code for code in blocks)
    run_blocks(blocks, str(path.relative_to(ROOT)), x64=x64)


@pytest.mark.parametrize("path", PAGES, ids=[str(p.relative_to(ROOT / "docs")) for p in PAGES])
def test_page_blocks_run_and_print_what_they_say(path):
    run_page(path)


def test_collector_finds_blocks_and_promises():
    text = "x\n```python\nprint(1)  # 1\n```\n```bash\nls\n```\n```python\ny = 2\n```\n"
    assert python_blocks(text) == ["print(1)  # 1\n", "y = 2\n"]
    assert promised_lines("print(1)  # 1\nprint(2)\n") == ["1"]
    with pytest.raises(AssertionError):
        run_blocks(["print(1)  # 2\n"], "fake", x64=False)
    run_blocks(
        ["import jax.numpy as jnp\nx = jnp.ones(2)\n", "print(x.dtype)  # float32\n"], "f", False
    )
