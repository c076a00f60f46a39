"""What the ``shardflow`` command line keeps off the terminal: a quiet broken pipe, the runtime-only install.

* **A quiet broken pipe.** ``shardflow show x@latest | head -3`` ends like
  ``cat`` or ``seq`` would (:func:`quiet_broken_pipe`).
* **The runtime-only install.** ``shardflow build`` without the pipeline extra
  says what to install, in one line (:func:`check_pipeline_installed`).

What Prefect prints during a build is filtered in ``shardflow.flows.console``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from shardflow.errors import ShardflowError

__all__ = ["EXIT_BROKEN_PIPE", "stdout_closed", "quiet_broken_pipe", "PIPELINE_MODULES", "PIPELINE_HINT",
           "check_pipeline_installed"]

EXIT_BROKEN_PIPE = 128 + 13  # 128 + SIGPIPE: what the shell reports for `cat` or `seq` cut off by `| head`


# -- standard output closed by its reader ---------------------------------------------------------------


def stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader has gone (``| head``): Linux reports POLLERR on it."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(mask & select.POLLERR for _, mask in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return True  # no poll (not Linux) or no real stdout: the BrokenPipeError is most likely stdout's


def quiet_broken_pipe() -> int:
    """The reader of standard output (``| head -3``) has what it wanted: end quietly, as ``cat`` or ``seq`` do.

    The status is 141 (128 + SIGPIPE), what the shell reports for a tool that
    SIGPIPE ended, so ``set -o pipefail`` scripts see what they see for ``cat``.
    Nothing is printed: the output was cut short by its reader, not by a
    failure. Standard output goes to /dev/null, so that the interpreter's last
    flush of what is still buffered does not fail again.
    """
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return EXIT_BROKEN_PIPE


# -- the runtime-only install ------------------------------------------------------------------------

# What `shardflow build` imports that the runtime install (numpy and PyYAML only) lacks.
PIPELINE_MODULES = ("pyarrow", "prefect", "tiktoken", "tokenizers", "sentencepiece", "gigatoken", "ml_dtypes",
                    "datasets", "fastapi", "matplotlib")
PIPELINE_HINT = "pip install 'shardflow[pipeline]'"


def check_pipeline_installed(args: argparse.Namespace) -> None:
    """Refuse a build in an install without the pipeline extra, before any work, in one line."""
    import importlib.util

    needed = ("pyarrow",) if args.no_prefect else ("pyarrow", "prefect")
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        raise ShardflowError(
            f"shardflow {args.command} needs the build pipeline ({', '.join(missing)} not installed "
            f"here: this looks like the runtime-only install); {PIPELINE_HINT}"
        )
