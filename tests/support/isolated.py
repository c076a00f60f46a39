"""A real Dask cluster whose workers share no path with the client or with each other, as separate machines.

The scheduler runs as in support/dask.py. Each ``dask worker`` command runs under
``unshare --mount --propagation private`` (a mount namespace of its own; root only), through a small ``sh``
launcher that, in the new namespace, mounts a fresh tmpfs over each ``hidden`` path (the client's directories:
typically the test's temporary directory with its scratch, corpus copy and data root), creates the worker's own
directory inside that tmpfs (``<hidden[0]>/worker-<name>/`` with ``home``, ``tmp``, ``scratch``, ``cache``,
``space``), changes into it and execs ``dask worker`` with ``HOME``, ``TMPDIR``, ``SHARDFLOW_SCRATCH``,
``XDG_*`` and ``--local-directory`` there. The tmpfs belongs to the namespace: the worker sees none of the
client's files under a hidden path, the client and the other workers see none of the worker's, and it goes away
with the worker's last process. ``unshare`` and ``sh`` exec (no fork), so the command's process group is the
nanny's and its worker process's, as in support/dask.py, and ``DaskCluster.close()`` stops it the same way.

Everything a worker needs must stay visible (never under a hidden path): the interpreter and its environment
(``sys.prefix``, ``sys.base_prefix``), shardflow's sources, the ``dask`` command, the audit directory and the
preload; :func:`start_isolated_cluster` checks this before starting anything. The logs are written through the
descriptors the worker inherits, so they may lie under a hidden path.

Each worker loads tests/support/audit_preload.py (``--preload``, in the worker process, not the nanny): an audit
hook logs every path the worker process opens, lists, creates, removes or renames to
``<audit>/audit-<name>-<pid>.log``; :func:`opened_paths` reads them back by worker name and
:func:`assert_no_path_under` fails, readably, if a worker touched a path under a forbidden directory.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from support.dask import DaskCluster, DaskProcess, dask_command, start_scheduler
from support.paths import SRC_DIR

AUDIT_PRELOAD = Path(__file__).resolve().parent / "audit_preload.py"
"""The ``--preload`` file of every isolated worker, passed by path: by module name it would need tests/support on
the workers' ``PYTHONPATH``, where support/dask.py would shadow the ``dask`` package."""

# The launcher, run by ``unshare`` in the worker's new mount namespace: ``sh -c LAUNCHER isolated-worker SIZE
# COUNT HIDDEN... OWN COMMAND...``. Why ``cd``: a process keeps its working directory by reference, not by path,
# so a cwd under a hidden path would still reach the client's files below the tmpfs; it is changed after the mounts.
LAUNCHER = r"""set -eu
size=$1; count=$2; shift 2
while [ "$count" -gt 0 ]; do
    mount -t tmpfs -o "mode=0755,size=$size" shardflow-isolated "$1"
    shift; count=$((count - 1))
done
own=$1; shift
mkdir -p "$own/home" "$own/tmp" "$own/scratch" "$own/cache" "$own/config" "$own/data" "$own/space"
cd "$own/home"
exec "$@"
"""


def isolation_unavailable() -> str | None:
    """Why isolated workers cannot run here (no ``unshare``, or no right to make a mount namespace and mount a
    tmpfs in it: not root), or None if they can."""
    for tool in ("unshare", "mount", "sh"):
        if shutil.which(tool) is None:
            return f"no `{tool}` command"
    with tempfile.TemporaryDirectory(prefix="isolation-probe-") as point:
        probe = subprocess.run(["unshare", "--mount", "--propagation", "private",
                                "sh", "-c", 'mount -t tmpfs -o size=1m probe "$1"', "probe", point],
                               capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot mount a tmpfs in a new mount namespace: {probe.stderr.strip() or probe.returncode}"
    return None


def outermost(paths: Iterable[Path]) -> list[Path]:
    """``paths`` (resolved) less those under another one: a tmpfs over a directory hides all below it, and the
    directories below no longer exist as mount points once it is mounted."""
    resolved = sorted({Path(p).resolve() for p in paths}, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in resolved:
        if not any(path.is_relative_to(k) for k in kept):
            kept.append(path)
    return kept


def check_visible(needed: Mapping[str, Path], hidden: Iterable[Path]) -> None:
    """Fail, naming both, if anything a worker needs lies under (or is) a hidden path."""
    bad = [
        f"{what} {path} is under the hidden path {h}"
        for what, path in needed.items()
        for h in hidden
        if Path(path).resolve().is_relative_to(h)
    ]
    if bad:
        raise ValueError("an isolated worker would not see what it needs (hide narrower directories):\n  "
                         + "\n  ".join(bad))


@dataclass
class IsolatedDaskCluster(DaskCluster):
    """A :class:`DaskCluster` whose ``start_worker`` starts each worker in a mount namespace of its own (see the
    module's text); ``close()``, ``logs()``, ``wait_for_workers()`` and the rest are DaskCluster's."""

    hidden: list[Path] = field(default_factory=list)
    """The directories each worker sees as an empty tmpfs of its own (resolved, outermost only)."""
    own_root: Path = Path("/nonexistent")
    """Where the workers' own directories are made, inside their tmpfs (the first hidden path)."""
    audit: Path = Path("/nonexistent")
    """The audit logs' directory (visible to every worker)."""
    tmpfs_size: str = "2g"
    """Each worker's tmpfs size limit (``mount -o size=``): the worker's files are in memory."""

    def worker_directory(self, name: str) -> Path:
        """The worker ``name``'s own directory: it exists in that worker's mount namespace only."""
        return self.own_root / f"worker-{name}"

    def start_worker(self, name: str | None = None) -> DaskProcess:
        """``dask worker ADDRESS --nthreads 1`` as support/dask.py starts it, but under ``unshare`` and the launcher:
        the hidden paths are an empty tmpfs, and home, temporary, scratch and local directories its own."""
        name = name or f"w{len(self.workers)}"
        own = self.worker_directory(name)
        log = self.directory / f"worker-{name}.log"
        env = {
            **self.env,
            "HOME": str(own / "home"), "PWD": str(own / "home"), "TMPDIR": str(own / "tmp"),
            "SHARDFLOW_SCRATCH": str(own / "scratch"), "XDG_CACHE_HOME": str(own / "cache"),
            "XDG_CONFIG_HOME": str(own / "config"), "XDG_DATA_HOME": str(own / "data"),
            "SHARDFLOW_TEST_AUDIT": str(self.audit), "SHARDFLOW_TEST_WORKER": name,
            # The imports of shardflow itself are not worth a line each in the audit log.
            "SHARDFLOW_TEST_AUDIT_SKIP": str(SRC_DIR),
        }
        command = [
            shutil.which("unshare") or "unshare", "--mount", "--propagation", "private",
            shutil.which("sh") or "sh", "-c", LAUNCHER, "isolated-worker",
            self.tmpfs_size, str(len(self.hidden)), *map(str, self.hidden), str(own),
            *dask_command(), "worker", self.address, "--nthreads", "1", "--nworkers", "1", "--name", name,
            "--host", "127.0.0.1", "--no-dashboard", "--death-timeout", "60",
            "--local-directory", str(own / "space"), "--preload", str(AUDIT_PRELOAD),
        ]
        with open(log, "wb") as out:
            # cwd "/": the launcher changes into the worker's own directory once the tmpfs is mounted.
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd="/",
                                    start_new_session=True)
        worker = DaskProcess(name, proc, log)
        self.workers.append(worker)
        return worker


def start_isolated_cluster(
    directory: Path,
    env: Mapping[str, str],
    *,
    hidden: list[Path],
    workers: int = 2,
    audit: Path | None = None,
    tmpfs_size: str = "2g",
    timeout: float = 90,
) -> IsolatedDaskCluster:
    """``dask scheduler`` on a free loopback port and ``workers`` isolated ``dask worker`` commands, all registered.

    ``hidden``: existing directories no worker may see (each is an empty tmpfs of its own in every worker); the
    workers' own directories are made under ``hidden[0]`` (:meth:`IsolatedDaskCluster.worker_directory`).
    ``directory``: the scheduler's cwd and every process's log (it may be hidden). ``audit``: where the workers'
    audit logs go (default ``directory/audit``); it must not be hidden. Fails before starting anything if a hidden
    path is missing or would hide the interpreter, shardflow, the ``dask`` command, the preload or the audit logs.
    """
    if not hidden:
        raise ValueError("no hidden path: use support.dask.start_cluster for a cluster that shares the client's files")
    missing = [str(p) for p in hidden if not Path(p).is_dir()]
    if missing:
        raise ValueError(f"hidden paths must be existing directories (mount points): {missing}")
    directory.mkdir(parents=True, exist_ok=True)
    audit = (audit or directory / "audit").resolve()
    audit.mkdir(parents=True, exist_ok=True)
    own_root = Path(hidden[0]).resolve()
    roots = outermost(hidden)
    check_visible(
        {"the interpreter's environment (sys.prefix)": Path(sys.prefix),
         "the base interpreter (sys.base_prefix)": Path(sys.base_prefix),
         "the interpreter": Path(sys.executable), "shardflow's sources": SRC_DIR,
         "the dask command": Path(shutil.which(dask_command()[0]) or dask_command()[0]),
         "the audit preload": AUDIT_PRELOAD, "the audit directory": audit},
        roots,
    )

    address, scheduler = start_scheduler(directory, env)
    log = scheduler.log
    cluster = IsolatedDaskCluster(address, directory, dict(env), scheduler,
                                  hidden=roots, own_root=own_root, audit=audit, tmpfs_size=tmpfs_size)
    try:
        cluster.wait(lambda: "Scheduler at:" in log.read_text(errors="replace"), timeout, "scheduler listening")
        names = [cluster.start_worker().name for _ in range(workers)]
        cluster.wait_for_workers(names, timeout)
    except BaseException:
        cluster.close()
        raise
    return cluster


# -- the audit logs -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditRecord:
    """One line of a worker's audit log: which worker (name, process) did what (``event``) to which path."""

    worker: str
    pid: int
    event: str
    path: str


def audit_records(audit_dir: Path) -> list[AuditRecord]:
    """Every line of every ``audit-<name>-<pid>.log`` in ``audit_dir``, file by file, in each file's order."""
    records = []
    for log in sorted(Path(audit_dir).glob("audit-*-*.log")):
        name, _, pid = log.stem.removeprefix("audit-").rpartition("-")
        for line in log.read_text(errors="replace").splitlines():
            try:
                event, path = json.loads(line)
            except ValueError:  # a line cut short by a killed process
                continue
            records.append(AuditRecord(name, int(pid), event, path))
    return records


def opened_paths(audit_dir: Path, events: Iterable[str] | None = None) -> dict[str, set[str]]:
    """The paths each worker (by name, all its worker processes together) touched: those of the ``events`` given
    (``"open"``, ``"os.listdir"``, ...), or of every event logged (None; ``dask_setup`` lines are not paths)."""
    wanted = set(events) if events is not None else None
    found: dict[str, set[str]] = {}
    for r in audit_records(audit_dir):
        if r.event != "dask_setup" and (wanted is None or r.event in wanted):
            found.setdefault(r.worker, set()).add(r.path)
    return found


def assert_no_path_under(opened: Mapping[str, Iterable[str]], forbidden: Iterable[Path]) -> None:
    """Fail, listing each worker's offending paths (and which forbidden directory each is under), if any path of
    ``opened`` (:func:`opened_paths`) is one of ``forbidden`` or under one."""
    dirs = [Path(f) for f in forbidden]
    dirs += [d.resolve() for d in dirs if d.resolve() != d]  # both spellings: /tmp may be a link
    bad = {
        worker: sorted(f"{path}  (under {next(d for d in dirs if Path(path).is_relative_to(d))})"
                       for path in paths if any(Path(path).is_relative_to(d) for d in dirs))
        for worker, paths in opened.items()
    }
    bad = {worker: paths for worker, paths in bad.items() if paths}
    if bad:
        lines = [f"worker {worker} touched {len(paths)} forbidden path(s):\n    " + "\n    ".join(paths)
                 for worker, paths in sorted(bad.items())]
        raise AssertionError("workers touched paths under " + ", ".join(map(str, dirs)) + "\n  " + "\n  ".join(lines))
