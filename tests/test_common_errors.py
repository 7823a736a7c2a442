"""docs/errors.md quotes the library's own messages: each ```python block followed by a
```text block prints, when run, the text shown (line breaks aside; `...` stands for any
text, such as a file name or an address)."""

import contextlib
import io
import linecache
import pathlib
import re

import jax

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "errors.md"


def blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block of a Markdown text, in order."""
    return re.findall(r"^```(\w+)\n(.*?)^```", text, flags=re.S | re.M)


def matches(shown: str, printed: str) -> bool:
    """Whether `printed` is `shown`, whitespace runs aside, `...` standing for any text."""
    squeeze = lambda text: " ".join(text.split())
    parts = [re.escape(part) for part in squeeze(shown).split("...")]
    return re.fullmatch(".*?".join(parts), squeeze(printed), flags=re.S) is not None


def test_the_matcher():
    assert matches("TypeError: a b\nc ... d", "TypeError: a  b c at 0x7f d\n")
    assert not matches("TypeError: a b", "TypeError: a b c")
    assert not matches("ValueError: a", "TypeError: a")


def test_every_quoted_message_is_what_the_library_prints():
    namespace: dict = {}
    previous = None
    quoted = 0
    # As a reader runs the page: float32 and JAX's default promotion (tests/test_docs.py).
    with jax.numpy_dtype_promotion("standard"), jax.enable_x64(False):
        for index, (language, code) in enumerate(blocks(PAGE.read_text())):
            if language == "python":
                printed = io.StringIO()
                name = f"docs/errors.md block {index}"
                # Tracebacks show the line, as they do for code in a file.
                linecache.cache[name] = (len(code), None, code.splitlines(True), name)
                with contextlib.redirect_stdout(printed):
                    exec(compile(code, name, "exec"), namespace)
                previous = printed.getvalue()
            elif language == "text":
                assert previous is not None, f"block {index}: no code above it printed this"
                assert matches(code, previous), (index, code, previous)
                previous, quoted = None, quoted + 1
    assert quoted >= 8
