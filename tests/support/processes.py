"""The processes the tests start: a free loopback port for a server, and stopping a process group."""

from __future__ import annotations

import os
import signal
import socket
import subprocess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_group(process: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
    """Signal the process group that ``process`` leads (started with ``start_new_session=True``) and reap the
    leader; SIGKILL to the group if it still runs after ``timeout`` seconds."""
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):  # the group is gone (PermissionError: macOS, a zombie leader)
        pass
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
