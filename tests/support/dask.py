"""A real Dask cluster for the operations tests: ``dask scheduler`` and ``dask worker`` as separate processes.

This is the cluster the docs tell users to run (docs/OPERATIONS.md, "Scale
out"), on loopback: one ``dask scheduler`` on a free port and one
``dask worker ADDRESS --nthreads 1`` command per worker, each in its own
process group (the nanny and its worker process), so a test can kill one
worker alone, as a lost machine, or only its worker process, as the kernel's
OOM killer would (its nanny then starts a new one). Every process logs to a
file; ``DaskCluster.logs()`` shows them when something fails. ``close()``
kills every process group it started; ``--death-timeout`` on the workers and
``--idle-timeout`` on the scheduler stop them even if a test run is killed
before it can.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from support.processes import free_port, stop_group


def dask_command() -> list[str]:
    """The ``dask`` command of this interpreter's environment (as a user would type it)."""
    candidate = Path(sys.executable).parent / "dask"
    return [str(candidate)] if candidate.exists() else ["dask"]


@dataclass
class DaskProcess:
    """One process group the cluster started: the scheduler, or one ``dask worker`` command (nanny + worker)."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole group (a worker's nanny and its worker process), and reap the leader."""
        stop_group(self.process, sig)

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError as exc:
            return f"(no log: {exc})"


@dataclass
class DaskCluster:
    """A scheduler and its workers, started by ``start_cluster``; ``close()`` stops them all."""

    address: str
    directory: Path
    env: dict[str, str]
    scheduler: DaskProcess
    workers: list[DaskProcess] = field(default_factory=list)

    def start_worker(self, name: str | None = None) -> DaskProcess:
        """``dask worker ADDRESS --nthreads 1`` (one nanny, one worker process), in a process group of its own."""
        name = name or f"w{len(self.workers)}"
        log = self.directory / f"worker-{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [*dask_command(), "worker", self.address, "--nthreads", "1", "--nworkers", "1", "--name", name,
                 "--host", "127.0.0.1", "--no-dashboard", "--death-timeout", "60",
                 "--local-directory", str(self.directory / f"space-{name}")],
                stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=self.directory, start_new_session=True,
            )
        worker = DaskProcess(name, proc, log)
        self.workers.append(worker)
        return worker

    def client(self) -> Any:
        from distributed import Client

        return Client(self.address, set_as_default=False, timeout=30)

    def worker_info(self) -> dict[str, dict[str, Any]]:
        """The scheduler's view of its workers, by name: ``address``, ``nanny``, ``nthreads``, ..."""
        with self.client() as client:
            info = client.scheduler_info(n_workers=-1)["workers"]
        return {str(w["name"]): {"address": addr, **w} for addr, w in info.items()}

    def worker_groups(self) -> dict[str, DaskProcess]:
        """Each ``dask worker`` command's process group (nanny and worker process), by its worker's address."""
        groups = {p.name: p for p in self.workers}
        return {w["address"]: groups[name] for name, w in self.worker_info().items()}

    def worker_pids(self) -> dict[str, int]:
        """Each worker process's pid (the nanny's child, which the kernel's OOM killer would kill), by address."""
        with self.client() as client:
            return dict(client.run(os.getpid))

    def wait_for_workers(self, names: list[str], timeout: float = 90) -> dict[str, dict[str, Any]]:
        """Wait until exactly the workers ``names`` are registered with the scheduler (fails with the logs)."""
        def registered() -> dict[str, dict[str, Any]] | None:
            info = self.worker_info()
            return info if sorted(info) == sorted(names) else None

        return self.wait(registered, timeout, f"workers {names} registered")

    def wait(self, check: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
        """Poll ``check`` until it returns something truthy; on timeout or a dead scheduler, fail with the logs."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.scheduler.alive():
                raise RuntimeError(f"the dask scheduler exited while waiting for {what}\n{self.logs()}")
            found = check()
            if found:
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} after {timeout} s\n{self.logs()}")
            time.sleep(interval)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ({p.log}) ---\n{p.tail()}" for p in [self.scheduler, *self.workers])

    def close(self) -> None:
        """Kill every process group started (workers first, then the scheduler); fails if any process survives."""
        import psutil  # a dependency of distributed

        started: list[psutil.Process] = []
        for proc in [*self.workers, self.scheduler]:
            try:
                leader = psutil.Process(proc.process.pid)
                started += [leader, *leader.children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
        for proc in [*self.workers, self.scheduler]:
            # SIGKILL for workers (nothing of theirs to keep); the scheduler gets SIGTERM, then SIGKILL after 20 s.
            # The group even when its leader is gone: a worker process of a dead nanny could still be there.
            proc.kill(signal.SIGTERM if proc is self.scheduler else signal.SIGKILL)
        _, alive = psutil.wait_procs(started, timeout=20)
        for orphan in alive:
            orphan.kill()
        if alive:
            raise RuntimeError(f"dask processes outlived their process group: {alive}\n{self.logs()}")


def start_scheduler(directory: Path, env: Mapping[str, str]) -> tuple[str, DaskProcess]:
    """``dask scheduler`` on a free loopback port, in a process group of its own: its address and process."""
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = directory / "scheduler.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*dask_command(), "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard",
             "--idle-timeout", "600"],
            stdout=out, stderr=subprocess.STDOUT, env=dict(env), cwd=directory, start_new_session=True,
        )
    return f"tcp://127.0.0.1:{port}", DaskProcess("scheduler", proc, log)


def start_cluster(directory: Path, env: Mapping[str, str], workers: int = 2, timeout: float = 90) -> DaskCluster:
    """``dask scheduler`` on a free loopback port and ``workers`` separate ``dask worker`` commands, all registered."""
    address, scheduler = start_scheduler(directory, env)
    log = scheduler.log
    cluster = DaskCluster(address, directory, dict(env), scheduler)
    try:
        cluster.wait(lambda: "Scheduler at:" in log.read_text(errors="replace"), timeout, "scheduler listening")
        names = [cluster.start_worker().name for _ in range(workers)]
        cluster.wait_for_workers(names, timeout)
    except BaseException:
        cluster.close()
        raise
    return cluster
