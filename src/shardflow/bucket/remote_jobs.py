"""A build to a bucket on workers that share no filesystem with the driver, nor with each other.

The driver (the process that runs ``drive``) claims the version's prefix on the bucket before any job
runs and records where the build's files go in its staging directory (``sends.json``, a ``Sends``).
From then on each job of a worker runs in a staging directory of the worker's own
(``<scratch>/jobs/<staging name>/``, on its local disk), exactly as a local build's job does, and
sends what it made to the bucket:

* ``tokenize_job``: the unit is tokenized into the worker's disk. Its pieces of a *placed* split
  stay there (each becomes one shard, sent once, by ``write_job``, under its final name, which the
  layout gives only after every unit is tokenized); pieces of a *gathered* split (val, or every
  split of a ``val_count`` build or a target that wants one file per split) go to the bucket's
  staging prefix, to be cut into shards by whichever worker writes them. The unit's records (its
  counts, document table and statistics) come back to the driver by value and go to the staging
  prefix, where a rerun from any machine finds them.
* ``write_job``: the shard is written (a piece linked, or gathered) and checked as it is written (its record,
  ``pipeline/check.py``), and sent to its final key, each file with the SHA-256 taken when it was written; then its
  records come back, and its local files are deleted. A placed shard's piece is on the worker that
  tokenized its unit (the driver asks Dask for that worker); on any other worker (that one was
  lost) the unit is tokenized again there, byte for byte the same.

Every record reaches the driver's staging after the files it describes are on the bucket, so a
record there is the proof that the files are sent (``Staging.sends``). Nothing is visible as a
version before ``send_version`` adds the bucket catalog's entry, the commit point, as ``push``
does. Jobs of an incremental build that link the parent's shards run in the driver, where the
parent was fetched, and their files are copied within the bucket from the parent's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..catalog import VersionEntry, file_lock
from ..errors import ConfigError
from ..formats import bosidx, get_format
from ..formats.writer import header_bytes
from ..manifest import MANIFEST_NAME, read_manifest
from ..pipeline.layout import gathered_splits, read_layout
from ..pipeline.model import BuildPlan, UnitResult
from ..pipeline.staging import Staging, write_plan
from ..pipeline.tokenize import split_decided_late, tokenize_unit
from ..pipeline.write import gathered_segments, write_shard
from .fs import filesystem, update_object
from .layout import CLAIM_NAME, BucketTarget
from .lease import check_held
from .push import PushResult, finish_push, plan_push, push_files, upload_file

__all__ = ["Sends", "Shipped", "read_sends", "write_sends", "commit_records", "share_layout", "fetch_records",
           "tokenize_job", "write_job", "send_version", "job_root", "discard_job_dirs", "work_id", "gathered_pieces"]

log = logging.getLogger("shardflow.pipeline")


@dataclass(frozen=True, kw_only=True)
class Sends:
    """Where a build's files go: the version claimed on the bucket, and the prefix of its jobs' records."""

    version: str
    version_url: str
    """``s3://B/data/NAME/vN``: every file of the version, at its final key."""
    staging_url: str
    """``s3://B/data/NAME/.staging/ID``: the jobs' records and the gathered splits' pieces (deleted at publish)."""
    target: BucketTarget
    catalog_url: str
    build_key: str = ""
    """The plan's build key: its lease's name (``shardflow gc`` leaves the prefix of a build whose lease is live)."""

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "version_url": self.version_url, "staging_url": self.staging_url,
                "target": dataclasses.asdict(self.target), "catalog_url": self.catalog_url, "build_key": self.build_key}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Sends":
        return cls(version=d["version"], version_url=d["version_url"], staging_url=d["staging_url"],
                   target=BucketTarget(**d["target"]), catalog_url=d["catalog_url"], build_key=d.get("build_key", ""))


@dataclass(frozen=True)
class Shipped:
    """A job's result and its records (``{path in the staging directory: bytes}``), for the driver to commit."""

    result: Any
    records: dict[str, bytes]


def read_sends(staging: Staging) -> Sends | None:
    try:
        return Sends.from_dict(json.loads(staging.sends_file.read_text()))
    except FileNotFoundError:
        return None


def write_sends(staging: Staging, sends: Sends) -> None:
    _write_local(staging.sends_file, json.dumps(sends.to_dict(), sort_keys=True).encode())


def _order(rel: str) -> tuple[bool, bool, str]:
    """Files first, then ``.json`` markers, a shard's ``.shard.json`` last: its marker says the whole job is done."""
    return rel.endswith(".json"), rel.endswith(".shard.json"), rel


def _write_local(dest: Path, data: bytes) -> None:
    """``data`` at ``dest``, atomically, under a temporary name of its own (threads of a worker write side by side)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def commit_records(staging: Staging, records: dict[str, bytes]) -> None:
    """Write a job's records into ``staging``, its ``.json`` commit markers last."""
    for rel in sorted(records, key=_order):
        _write_local(staging.root / rel, records[rel])


def _url(base: str, rel: str) -> str:
    return f"{base}/{rel}"


def _put_records(sends: Sends, records: dict[str, bytes]) -> None:
    """The records on the bucket's staging prefix too, the ``.json`` markers last: a rerun from any machine finds them."""
    fs, _ = filesystem(sends.staging_url)
    for rel in sorted(records, key=_order):
        fs.pipe_file(filesystem(_url(sends.staging_url, rel))[1], records[rel])


def _get(sends: Sends, rel: str, dest: Path) -> bool:
    """Download ``rel`` of the staging prefix to ``dest`` (False: not there)."""
    fs, path = filesystem(_url(sends.staging_url, rel))
    try:
        data = fs.cat_file(path)
    except FileNotFoundError:
        return False
    _write_local(dest, data)
    return True


# --- the driver's side ------------------------------------------------------------------------------------------

def share_layout(staging: Staging, sends: Sends) -> None:
    """Put the layout's files on the staging prefix, ``layout.json`` last, for the workers' ``write_job``s."""
    files = sorted(p for p in staging.layout_dir.iterdir() if p.suffix in (".npy", ".i64"))
    _put_records(sends, {p.relative_to(staging.root).as_posix(): p.read_bytes() for p in files}
                 | {"layout/layout.json": staging.layout_file.read_bytes()})


def fetch_records(staging: Staging, sends: Sends) -> int:
    """Commit into ``staging`` the records a run of this build on another machine left on the bucket (units
    tokenized, shards sent); returns how many jobs' records were found."""
    fs, root = filesystem(sends.staging_url)
    try:
        found = fs.find(root)
    except FileNotFoundError:
        return 0
    rels = [p[len(root) + 1:] for p in found if p.startswith(f"{root}/")]
    records = {rel: fs.cat_file(f"{root}/{rel}") for rel in rels if _RECORD.match(rel)}
    commit_records(staging, records)
    return sum(rel.endswith(".json") for rel in records)


# --- the workers' side ------------------------------------------------------------------------------------------

# What a job commits in the driver's staging: a unit's record, document table and statistics, a gathered piece's
# document starts (its tokens stay on the bucket), a shard's records.
_RECORD = re.compile(r"^(parts/unit-[0-9]+\.(json|docs\.npy|stats\.npz)|parts/unit-[0-9]+/[^/]+\.bos\.idx"
                     r"|layout/[^/]+\.(shard|valid)\.json)$")

_SETUP = threading.Lock()  # a worker's threads set up a job directory (its plan, its layout) one at a time


def work_id(plan: BuildPlan, catalog_url: str) -> str:
    """16 hex digits naming this build's work: its build key, catalog, units and parent (what a resumed run must
    share with the one it resumes: two plans that cut other units never mix their jobs' files)."""
    work = {"build_key": plan.build_key, "catalog": catalog_url, "units": [u.to_dict() for u in plan.units],
            "reuse": plan.reuse.signature() if plan.reuse else None}
    return hashlib.sha256(json.dumps(work, sort_keys=True).encode()).hexdigest()[:16]


def job_root(sends: Sends) -> Path:
    """This machine's staging directory for a build's jobs: ``<scratch>/jobs/<work id>`` (the staging prefix's)."""
    from .build import default_scratch

    return default_scratch() / "jobs" / sends.staging_url.rstrip("/").rsplit("/", 1)[-1]


def _here(sends: Sends, plan: BuildPlan) -> BuildPlan:
    """``plan`` with its staging directory on this machine, its ``plan.json`` written there."""
    root = job_root(sends)
    local = dataclasses.replace(plan, staging=str(root))
    with _SETUP:
        if not Staging(root).plan_file.exists():
            root.mkdir(parents=True, exist_ok=True)
            write_plan(local)
    return local


def _gathered_streams(plan: BuildPlan) -> set[str]:
    return {"all"} if split_decided_late(plan) else set(gathered_splits(plan))


def _unit_records(staging: Staging, unit: int) -> dict[str, bytes]:
    stem = staging.unit_files(unit)[0]
    return {p.relative_to(staging.root).as_posix(): p.read_bytes()
            for p in sorted(stem.parent.glob(f"{stem.name}.*")) if p.is_file() and _RECORD.match(f"parts/{p.name}")}


def _tokenized_here(plan: BuildPlan, unit: int) -> UnitResult:
    """``tokenize_unit`` in this machine's staging, one job at a time per unit (threads and processes of the machine
    that share its scratch: another job may need the same pieces)."""
    lock = Staging(plan.staging).parts / f".unit-{unit:06d}.lock"
    with file_lock(lock, timeout=None, what=f"work unit {unit}", remove=True):
        return tokenize_unit(plan, unit)


def tokenize_job(sends: Sends, plan: BuildPlan, unit: int) -> Shipped:
    """Tokenize ``unit`` on this machine; send its gathered pieces and records to the staging prefix."""
    here = _here(sends, plan)
    staging = Staging(here.staging)
    result = _tokenized_here(here, unit)
    ext = get_format(plan.config.format).extension
    fs, _ = filesystem(sends.staging_url)
    records: dict[str, bytes] = {}
    sent: list[Path] = []
    for stream in sorted(_gathered_streams(plan) & set(result.pieces)):
        for p, piece in enumerate(result.pieces[stream]):
            path = staging.piece(unit, stream, p, ext)
            rel = path.relative_to(staging.root).as_posix()
            upload_file(fs, path, filesystem(_url(sends.staging_url, rel))[1], piece.bytes, piece.sha256)
            index = bosidx.index_path(path)  # the layout reads a gathered piece's document starts
            records[index.relative_to(staging.root).as_posix()] = index.read_bytes()
            sent += [path, index, *path.parent.glob(f"{path.stem}.*")]
    records |= _unit_records(staging, unit)
    _put_records(sends, records)
    for path in sent:  # on the bucket now: whichever worker writes their shards reads them from there
        path.unlink(missing_ok=True)
    return Shipped(result, records)


def _layout_here(sends: Sends, staging: Staging, split: str) -> None:
    """The layout's files this job reads, from the staging prefix (once per machine: a job directory is one work's,
    whose layout never changes)."""
    with _SETUP:
        for path in (staging.segments(split), staging.starts(split)):
            if not path.exists():
                _get(sends, path.relative_to(staging.root).as_posix(), path)
        if not staging.layout_file.exists() and not _get(sends, "layout/layout.json", staging.layout_file):
            raise ConfigError(f"{sends.staging_url}/layout/layout.json: not there; the driver shares the layout "
                              "before any shard job runs: run the build again")


def _placed_piece_here(plan: BuildPlan, staging: Staging, split: str, unit: int, p: int) -> list[Path]:
    """A placed shard's piece on this machine (the unit tokenized again here if the worker that holds it was lost);
    the piece's files, to delete once the shard is sent."""
    path = staging.piece(unit, split, p, get_format(plan.config.format).extension)
    if staging.unit_result(unit) is None or not path.exists() or not bosidx.index_path(path).exists():
        log.warning("work unit %d's pieces are not on this machine (the worker that tokenized it is gone): "
                    "tokenizing it again here", unit)
        _tokenized_here(plan, unit)
    return [path, bosidx.index_path(path), *path.parent.glob(f"{path.stem}.*")]


def _gathered_here(sends: Sends, plan: BuildPlan, staging: Staging, split: str, k: int) -> list[Path]:
    """The byte ranges of the staging prefix's pieces that gathered shard ``k`` copies, at their offsets in local
    sparse files (a val shard of a ``--val-count`` build reads a few documents of every unit, never every piece
    whole); the files, to delete once the shard is sent."""
    fmt = get_format(plan.config.format)
    itemsize = np.dtype(plan.dtype).itemsize
    skip = header_bytes(fmt, np.dtype(plan.dtype))
    stream = "all" if split_decided_late(plan) else split
    fs, _ = filesystem(sends.staging_url)
    made: list[Path] = []
    for unit, start, count in gathered_segments(plan, split, k):
        if unit < 0:
            continue  # a range of the parent's split: read where the parent is (the driver: DaskExecutor)
        record = staging.unit_files(unit)[2]
        if not record.exists() and not _get(sends, record.relative_to(staging.root).as_posix(), record):
            raise ConfigError(f"{sends.staging_url}: work unit {unit} has no record; run the build again")
        result = staging.unit_result(unit)
        assert result is not None
        pos = 0
        for p, piece in enumerate(result.pieces.get(stream, ())):
            lo, hi = max(start, pos), min(start + count, pos + piece.tokens)
            if lo < hi:
                path = staging.piece(unit, stream, p, fmt.extension)
                path.parent.mkdir(parents=True, exist_ok=True)
                first, last = skip + (lo - pos) * itemsize, skip + (hi - pos) * itemsize
                data = fs.cat_file(filesystem(_url(sends.staging_url, path.relative_to(staging.root).as_posix()))[1],
                                   start=first, end=last)
                with open(path, "ab") as grow:  # created if absent; the ranges land at their own offsets
                    grow.truncate(max(grow.tell(), piece.bytes))
                with open(path, "r+b") as f:
                    f.seek(first)
                    f.write(data)
                made += [path, record]
            pos += piece.tokens
    return made


def gathered_pieces(sends: Sends, plan: BuildPlan, split: str, k: int) -> list[Path]:
    """What gathered shard ``k`` copies from the units' pieces, fetched into ``plan``'s own staging directory (the
    driver's, for a gathered shard of an incremental build, which also copies ranges of the parent)."""
    return _gathered_here(sends, plan, Staging(plan.staging), split, k)


def write_job(sends: Sends, plan: BuildPlan, split: str, k: int) -> Shipped:
    """Write and check shard ``k`` of ``split`` on this machine, send its files to their final keys, and return
    its records; its local files are then deleted."""
    here = _here(sends, plan)
    staging = Staging(here.staging)
    _layout_here(sends, staging, split)
    sources = read_layout(here).splits[split].sources
    if sources is None:
        # Gathered: one such job at a time on this machine (they fill the same sparse piece files).
        with file_lock(staging.root / ".gathered.lock", timeout=None, what="a gathered shard", remove=True):
            return _write_and_send(sends, here, staging, split, k, _gathered_here(sends, here, staging, split, k))
    return _write_and_send(sends, here, staging, split, k, _placed_piece_here(here, staging, split, *sources[k]))


def _write_and_send(sends: Sends, here: BuildPlan, staging: Staging, split: str, k: int, used: list[Path]) -> Shipped:
    written = write_shard(here, split, k)  # checked as it is written (pipeline/check.py): nothing is read back
    entry = written.entry
    fs, _ = filesystem(sends.version_url)
    files = [(entry.file, entry.bytes, entry.sha256), *((f.file, f.bytes, f.sha256) for f in entry.files)]
    for file, size, sha in files:
        upload_file(fs, staging.out / file, filesystem(_url(sends.version_url, file))[1], size, sha)
    records = {p.relative_to(staging.root).as_posix(): p.read_bytes()
               for p in (staging.shard_result(split, k), staging.shard_check(split, k))}
    _put_records(sends, records)
    # Sent: this machine's copies go (a rerun here writes the shard again, as it would anywhere else).
    for path in [*(staging.out / file for file, _, _ in files), staging.shard_result(split, k),
                 staging.shard_check(split, k), *used]:
        path.unlink(missing_ok=True)
    return Shipped(written, records)


# --- publishing -------------------------------------------------------------------------------------------------

def _rekey_claim(sends: Sends, name: str, planned_key: str, build_key: str) -> None:
    """The version's claim, made at planning under the plan's build key, now under the build key the manifest
    records (they differ when inputs on object storage were keyed by identity until the workers hashed them)."""
    if planned_key == build_key:
        return
    url = f"{sends.version_url}/{CLAIM_NAME}"

    def rekeyed(current: bytes | None) -> bytes | None:
        record = json.loads(current) if current else {}
        if record.get("build_key") not in (None, planned_key):
            return None  # not ours to change: plan_push's claim says whose it is
        # ``planned_key`` stays: a rerun (its plan keyed by identity again) knows the claim as its own.
        return json.dumps({**record, "ref": f"{name}@{sends.version}", "build_key": build_key,
                           "planned_key": planned_key, "catalog": sends.catalog_url}).encode()

    update_object(url, rekeyed, again="run the build again")


def send_version(staging: Staging, sends: Sends, *, name: str, build_key: str, planned_key: str
                 ) -> tuple[str, PushResult]:
    """Publish the staged version, whose shards the workers sent: its other files (written here: the tokenizer's,
    the statistics, the card) and the parent's reused shards (copied within the bucket), then the manifest, then
    the bucket catalog's entry (the commit point), as ``push`` does; the staging prefix is then deleted."""
    out = staging.out
    manifest = read_manifest(out)
    data = (out / MANIFEST_NAME).read_bytes()
    entry = VersionEntry(version=sends.version, path=sends.version_url, created_at=manifest.created_at,
                         build_key=build_key, parent=manifest.parent,
                         totals={k: manifest.totals[k] for k in ("documents", "tokens", "shards", "bytes")},
                         manifest_sha256=hashlib.sha256(data).hexdigest())
    _rekey_claim(sends, name, planned_key, build_key)
    plan = plan_push(out, manifest, entry, target=sends.target, catalog_url=sends.catalog_url)
    if isinstance(plan, PushResult):
        return plan.ref, plan
    # Each file is skipped (a worker sent it: its size and SHA-256 are checked on the bucket, one HEAD each),
    # copied from the parent, or sent from here; a shard that is none of these fails the publish, naming it.
    # One run of files per thread, as push_version does: each call lists the prefix once.
    step = max(1, -(-len(plan.files) // 8))
    with ThreadPoolExecutor(max_workers=8) as pool:
        done = [how for hows in pool.map(lambda i: push_files(plan, plan.files[i:i + step]),
                                         range(0, len(plan.files), step)) for how in hows]
    # Committed only by the holder of the build key's lease: one that stalled past its ttl lost it to a build
    # that goes on from the same records; this one stops here.
    check_held(sends.target, name, planned_key)
    result = finish_push(plan, done)
    fs, root = filesystem(sends.staging_url)
    try:
        fs.rm(root, recursive=True)
    except FileNotFoundError:
        pass
    return result.ref, result


def discard_job_dirs(sends: Sends) -> None:
    """This machine's job directory of a build (after its publish)."""
    shutil.rmtree(job_root(sends), ignore_errors=True)
