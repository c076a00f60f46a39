"""Fault injection for the reliability tests: kill the process, or fail a write, at a named point.

The build calls ``fault("shard-mid")`` (and so on) at the points listed in
``POINTS``. Normally that costs one environment lookup and does nothing. With
``SHARDFLOW_FAULT`` set, matching points act:

    SHARDFLOW_FAULT=shard-mid            SIGKILL this process the first time shard-mid is reached
    SHARDFLOW_FAULT=tokenize-batch:3     ... the 3rd time it is reached (hits are counted per process)
    SHARDFLOW_FAULT=enospc:shard-mid     raise OSError(ENOSPC) every time (a full disk stays full)
    SHARDFLOW_FAULT=enospc:shard-mid:2   ... from the 2nd hit on
    SHARDFLOW_FAULT=eio:tokenize-tokens:1  raise OSError(EIO) on the 1st hit only (a transient error)
    SHARDFLOW_FAULT=sleep2.5:plan        sleep 2.5 seconds at every hit (to make runs overlap)
    SHARDFLOW_FAULT=wait:layout          at the first hit, create $SHARDFLOW_FAULT_RELEASE.reached-PID,
                                         then block until the file $SHARDFLOW_FAULT_RELEASE exists

Several specs may be given, separated by commas. An unknown point or action is
a ``ConfigError``, so a typo cannot silently test nothing.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import threading
import time

from .errors import ConfigError

__all__ = ["POINTS", "ACTIONS", "fault", "reset", "hits", "ENV", "RELEASE_ENV"]

ENV = "SHARDFLOW_FAULT"
RELEASE_ENV = "SHARDFLOW_FAULT_RELEASE"

POINTS: dict[str, str] = {
    "plan": "plan_build: after plan.json is written",
    "tokenize-batch": "tokenize_unit: after a batch's tokens are written to the unit's temporary file",
    "tokenize-tokens": "tokenize_unit: after the unit's tokens and document table are in place, before its .json",
    "tokenize-done": "tokenize_unit: after the unit's .json (the unit is committed)",
    "layout": "make_layout: after the segment and start files, before layout.json",
    "shard-mid": "write_shard: after the header and the first block, before the shard is complete",
    "shard-written": "write_shard: after the shard file is in place, before its .bos.idx",
    "shard-indexed": "write_shard: after the .bos.idx, before the shard's .json",
    "shard-linked": "write_shard: after a shard is hard-linked from the parent version, before its .bos.idx",
    "card-plot": "draw_plots: after each PNG of the dataset card is in place (the stats-card stage, or finalize)",
    "finalize-manifest": "finalize: after the staged manifest is written, before validation",
    "validate": "validation: at the start of every shard's check (a build's finalize: its record against its files)",
    "finalize-done": "finalize: after validation passed",
    "publish-stamped": "publish: after the version is stamped into the manifest, before the rename",
    "publish-renamed": "publish: after the rename into the data root, before the catalog entry",
    "catalog-write": "catalog: before the catalog file is replaced",
    "publish-cataloged": "publish: after the catalog entry, before the staging directory is removed",
    "atomic-write": "any atomic file write: after the temporary file, before the rename",
    "push-files": "push: after every file the manifest names is in the bucket, before the manifest",
    "push-uploaded": "push: after every file and the manifest are in the bucket, before the bucket catalog entry",
    "bucket-rm-cataloged": "rm on a bucket: after the entry is out of the bucket catalog, before its objects are deleted",
}

ACTIONS = ("kill", "enospc", "eio", "sleep", "wait")

_SPEC = re.compile(r"^(?:(kill|enospc|eio|wait|sleep(?:[0-9]*\.?[0-9]+)?):)?([a-z-]+)(?::([0-9]+))?$")
_hits: dict[str, int] = {}
_lock = threading.Lock()
_parsed: tuple[str, list[tuple[str, str, int | None]]] | None = None


def _specs(raw: str) -> list[tuple[str, str, int | None]]:
    global _parsed
    if _parsed is not None and _parsed[0] == raw:
        return _parsed[1]
    specs = []
    for part in filter(None, (p.strip() for p in raw.split(","))):
        m = _SPEC.match(part)
        if not m or m.group(2) not in POINTS:
            raise ConfigError(
                f"{ENV}={raw!r}: {part!r} is not [ACTION:]POINT[:N] with ACTION one of {', '.join(ACTIONS)} "
                f"and POINT one of {', '.join(POINTS)}"
            )
        specs.append((m.group(1) or "kill", m.group(2), int(m.group(3)) if m.group(3) else None))
    _parsed = (raw, specs)
    return specs


def fault(point: str, path: object = None) -> None:
    """Act on ``point`` if ``SHARDFLOW_FAULT`` asks for it (see the module docstring)."""
    raw = os.environ.get(ENV)
    if not raw:
        return
    specs = [s for s in _specs(raw) if s[1] == point]
    if not specs:
        return
    with _lock:
        _hits[point] = hit = _hits.get(point, 0) + 1
    for action, _, n in specs:
        if action == "kill" and (n is None and hit == 1 or hit == n):
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(60)  # never reached: SIGKILL cannot be handled
        elif action == "eio" and (n is None and hit == 1 or hit == n):
            raise OSError(errno.EIO, f"{os.strerror(errno.EIO)} (injected at {point})", *([str(path)] if path else []))
        elif action == "enospc" and (n is None or hit >= n):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), *([str(path)] if path else []))
        elif action.startswith("sleep") and (n is None or hit == n):
            time.sleep(float(action[5:] or 1.0))
        elif action == "wait" and (n is None and hit == 1 or hit == n):
            _wait_for_release(point)


def _wait_for_release(point: str) -> None:
    release = os.environ.get(RELEASE_ENV)
    if not release:
        raise ConfigError(f"{ENV}: 'wait:{point}' needs {RELEASE_ENV}=PATH (the file that releases the wait)")
    with open(f"{release}.reached-{os.getpid()}", "w"):
        pass
    deadline = time.monotonic() + 300
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.02)


def reset() -> None:
    """Forget the hits counted so far (for tests that inject faults in their own process)."""
    with _lock:
        _hits.clear()


def hits(point: str) -> int:
    """How often ``point`` was reached (and acted on) in this process since the last ``reset``."""
    with _lock:
        return _hits.get(point, 0)
