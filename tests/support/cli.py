"""The ``shardflow`` command: in this process (``run_main``) or in a subprocess (``run_cli``, ``build_cli``)."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

from support.paths import SHARDFLOW


class CliRun(NamedTuple):
    """What ``shardflow ARGS`` did: its exit status and everything it printed."""

    status: int
    out: str
    err: str


def run_main(*args: str | Path, cwd: Path | None = None) -> CliRun:
    """``shardflow ARGS`` in this process (``shardflow.cli.commands.main``), in ``cwd`` if given, its stdout and
    stderr captured. An argparse error still raises ``SystemExit``, as ``main`` does.
    """
    from shardflow.cli.commands import main

    out, err = io.StringIO(), io.StringIO()
    where = contextlib.chdir(cwd) if cwd is not None else contextlib.nullcontext()
    with where, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main([str(a) for a in args])
    return CliRun(status, out.getvalue(), err.getvalue())


def cli_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without ``SHARDFLOW_*`` variables (no stray fault), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDFLOW_")}
    env.update(extra or {})
    return env


def run_cli(
    args: Sequence[str | Path], env: Mapping[str, str] | None = None, cwd: Path | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """``python -m shardflow ARGS`` in a subprocess, stdout and stderr captured as text; ``env`` is its whole
    environment (by default ``cli_env()``)."""
    return subprocess.run(
        [*SHARDFLOW, *map(str, args)], env=dict(cli_env() if env is None else env), cwd=cwd, capture_output=True,
        text=True, timeout=timeout, check=False,
    )


def cli_args(options: dict[str, Any]) -> list[str]:
    """``shardflow build`` flags for BuildConfig ``options``."""
    out: list[str] = []
    for key, value in options.items():
        out += [f"--{key.replace('_', '-')}", str(value)]
    return out


def _build_args(sources: Path | str, root: Path, name: str, options: dict[str, Any], workers: int) -> list[str]:
    return ["build", str(sources), "--name", name, "--no-prefect", "--data-root", str(root / "data"),
            "--catalog", str(root / "catalog"), "--workers", str(workers), *cli_args(options)]


def build_cli(
    sources: Path | str, root: Path, name: str, options: dict[str, Any], *, fault: str | None = None, workers: int = 2
) -> subprocess.CompletedProcess[str]:
    """``shardflow build SOURCES --no-prefect`` into ``root/data`` + ``root/catalog``, optionally with a fault."""
    env = cli_env({"SHARDFLOW_FAULT": fault} if fault else None)
    return run_cli(_build_args(sources, root, name, options, workers), env, timeout=120)


def start_build_cli(
    sources: Path | str, root: Path, name: str, options: dict[str, Any], *, env: dict[str, str], workers: int = 2
) -> subprocess.Popen[str]:
    """``build_cli`` started in the background (``communicate()`` collects its output)."""
    return subprocess.Popen(
        [*SHARDFLOW, *_build_args(sources, root, name, options, workers)],
        env=cli_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def killed(proc: subprocess.CompletedProcess[str]) -> bool:
    return proc.returncode == -signal.SIGKILL
