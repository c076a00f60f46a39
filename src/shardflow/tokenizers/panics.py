"""A tokenizer library's panic (pyo3's ``PanicException``, a ``BaseException``) reported in one line naming the file.

A Rust library prints its panic's notice to file descriptor 2 before Python sees the exception;
``panic_notice_held`` holds it back around the short calls that may panic (loading a file), so the
one line is all the user sees.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
from typing import Iterator

from ..errors import ConfigError

__all__ = ["is_library_panic", "library_panic_error", "panic_notice_held", "one_line"]


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (Rust errors carry a multi-line location trailer)."""
    text = str(exc).strip().splitlines()
    return text[0].strip() if text else type(exc).__name__



def is_library_panic(exc: BaseException) -> bool:
    """Whether ``exc`` is a Rust library's panic as Python sees it: pyo3's ``PanicException`` (tokenizers,
    gigatoken), a ``BaseException`` that no public module exports, so matched by its class name."""
    return any(cls.__name__ == "PanicException" for cls in type(exc).__mro__)


def library_panic_error(tokenizer: str, doing: str, exc: BaseException) -> ConfigError:
    """One line for a tokenizer library that panicked ``doing`` something with the file ``tokenizer``: the file
    is the cause (the library's own notice, and its backtrace, are no use to the person who runs the build)."""
    detail = one_line(exc)
    if "retry-limit" in detail or "backtrack" in detail:
        cause = ("its pre-tokenizer's regular expression (a Split pattern) backtracks catastrophically on some text, "
                 "and the regex engine gave up; the file is at fault, not the text (a well-formed pattern, as Llama "
                 "3's, takes 200,000-character runs in under a second): fix the pattern or use another tokenizer file")
    else:
        cause = ("a tokenizer library does not panic on a well-formed file, whatever the text: the file is at fault; "
                 "check it, or use another tokenizer file")
    return ConfigError(f"tokenizer {tokenizer}: the tokenizer library panicked while {doing} ({detail}); {cause}")


_STDERR_LOCK = threading.Lock()


@contextlib.contextmanager
def panic_notice_held() -> Iterator[None]:
    """Hold back what is written to file descriptor 2 during the block, and copy it there after, unless the block
    raised a library panic: then it is dropped. A Rust library prints its panic's notice (and, under
    ``RUST_BACKTRACE``, a backtrace of dozens of lines) to fd 2 before Python sees the exception, so a caller that
    reports the panic in one line runs the library calls that may panic under this. It holds the whole process's
    fd 2: for short blocks only (loading a tokenizer file), never around a build's encoding."""
    with _STDERR_LOCK:
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError, AttributeError):  # no fd 2 (a daemon): nothing to hold back
            yield
            return
        panicked = False
        with tempfile.TemporaryFile() as held:
            os.dup2(held.fileno(), 2)
            try:
                yield
            except BaseException as exc:
                panicked = is_library_panic(exc)
                raise
            finally:
                with contextlib.suppress(Exception):
                    sys.stderr.flush()
                os.dup2(saved, 2)
                os.close(saved)
                if not panicked:  # another thread's lines meanwhile (progress, a warning): late, not lost
                    held.seek(0)
                    with contextlib.suppress(OSError):
                        while block := memoryview(held.read(1 << 16)):
                            while block:
                                block = block[os.write(2, block):]
