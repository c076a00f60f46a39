"""A watcher that runs a child process and stops it when its own parent dies, however that dies.

``shardflow build`` starts its temporary Prefect server under it (flows/server.py):
``kill -9`` or ``kill -TERM`` of the build runs no atexit handler, and the
server would be reparented to init and keep running. The watcher is a
``python -c`` script (it imports nothing of shardflow, so it starts in
milliseconds) that

* starts the command it is given in its own process group (Ctrl-C at the
  terminal is left to the build, which stops the server once its logs are
  drained), with the same stdin, so that the server reads the build's pipe
  too and stops itself if the watcher dies with the build (``kill -9`` of the
  build's process group: ``flows/server_app.py``), and exits with the
  command's status if it exits on its own;
* stops that group (SIGTERM, then SIGKILL after 4 s) and exits when its stdin,
  a pipe whose only write end the build holds, reaches EOF, when its parent
  pid changes (the build died), or on SIGTERM or SIGHUP (the build's ``stop()``).

Only public interfaces: a pipe, ``os.getppid``, ``os.killpg`` and, where there
is one, a pidfd to learn at once that the server exited.
"""

from __future__ import annotations

import sys
from typing import Sequence

__all__ = ["WATCHER", "watched"]

WATCHER = """
import os, select, signal, subprocess, sys
parent = os.getppid()
signal.signal(signal.SIGINT, signal.SIG_IGN)
server = subprocess.Popen(sys.argv[1:], start_new_session=True)  # its stdin: the build's pipe too
try:
    exited = [os.pidfd_open(server.pid)]  # readable once the server exits: no polling
except (AttributeError, OSError):
    exited = []
def wait(timeout):
    if exited and not select.select(exited, [], [], timeout)[0]:
        return False
    try:
        server.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        return False
def stop(*_):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for sig, timeout in ((signal.SIGTERM, 4), (signal.SIGKILL, None)):
        try:
            os.killpg(server.pid, sig)
        except OSError:
            pass
        if wait(timeout):
            break
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGHUP, stop)
while server.poll() is None:
    ready = select.select([0, *exited], [], [], 0.5)[0]
    if (0 in ready and not os.read(0, 1)) or os.getppid() != parent:
        stop()
os._exit(server.returncode if server.returncode >= 0 else 1)
"""


def watched(command: Sequence[str]) -> list[str]:
    """The command line that runs ``command`` under the watcher; give it the read end of a pipe as stdin."""
    return [sys.executable, "-c", WATCHER, *command]
