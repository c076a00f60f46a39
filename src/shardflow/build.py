"""The build pipeline's core steps, each a plain function an orchestrator can call.

    plan = plan_build(config)                        # inputs, fingerprints, work units, build key
    results = [tokenize_unit(plan.staging, u) for u in range(len(plan.units))]   # parallel-safe
    layout = make_layout(plan.staging)               # which tokens go to which split and shard
    shards = [write_shard(plan.staging, s, k) for s, n in layout.items() for k in range(n)]   # parallel-safe
    staged = finalize(plan.staging)                  # write the staged manifest, validate it
    ref = publish(plan.staging)                      # atomic rename + catalog entry (the commit point)

``build(config)`` runs them all in-process with a thread pool; the Prefect flow
in ``flows/`` composes the same steps as tasks. Every step writes under the
build's staging directory ``<data_root>/<name>/.staging/<build key>/`` with
temporary names and ``os.replace``, and every step first checks whether its
output already exists, so a build killed at any point resumes where it stopped
and produces the same bytes.

Layout of a staging directory::

    plan.json                  the plan (config, inputs with fingerprints, units)
    parts/unit-000007.tok      unit 7's tokens, boundary tokens inserted, final dtype
    parts/unit-000007.docs.npy per document: length (with boundary), row, split score
    parts/unit-000007.json     unit 7's counts: written last, marks the unit done
    layout/<split>.segments.npy, layout/<split>.starts.i64, layout.json
    out/                       the future version directory (shards, indexes, manifest)
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import re
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import numpy as np

from . import __version__
from ._io import atomic_write_text, fsync_dir, is_stale_tmp, remove_quietly, sha256_file, tmp_path_for
from .catalog import Catalog, VersionEntry, default_catalog, default_data_root, file_lock
from .config import BuildConfig, EmbedOptions
from .errors import CatalogError, ConfigError, InputError, ShardflowError, ValidationError, is_transient
from .faults import fault
from .formats import bosidx, get_format
from .formats.base import TOKEN_DTYPES
from .manifest import MANIFEST_NAME, SCHEMA_VERSION, Manifest, ShardEntry, SplitEntry, FileEntry, read_manifest, write_manifest
from .sources import InputFile, WorkUnit, discover_inputs, fingerprint_inputs, iter_text_batches, plan_units, split_scores
from .tokenizers import Tokenizer, check_identity, load_tokenizer

__all__ = [
    "BuildPlan",
    "UnitResult",
    "plan_build",
    "tokenize_unit",
    "make_layout",
    "write_shard",
    "finalize",
    "publish",
    "publish_out",
    "embed_staged",
    "embed_version",
    "build",
    "build_lock",
    "retrying",
    "BuildResult",
    "shard_file_name",
]

log = logging.getLogger("shardflow.build")

# Work is streamed in blocks of this many tokens so memory stays bounded
# whatever the shard size (16 Mi tokens = 64 MiB of uint32).
_BLOCK_TOKENS = 16 << 20
_DOC_DTYPE = np.dtype([("length", "<i8"), ("row", "<i8"), ("score", "<u8")])
# A segment's ``unit`` is a work unit (>= 0) whose part file holds the tokens,
# or -1 - SPLITS.index(split) for a range of the parent version's split stream
# (an input reused by an incremental build).
_SEGMENT_DTYPE = np.dtype([("unit", "<i8"), ("start", "<i8"), ("length", "<i8")])
SPLITS = ("train", "val")
BUILD_FORMAT_VERSION = 1
# Set to 1 to rebuild everything instead of reusing unchanged inputs' shards from the parent version.
NO_REUSE_ENV = "SHARDFLOW_NO_REUSE"
# Transient I/O errors: how often ``build`` retries a step, and the pause before retry n (seconds).
STEP_RETRIES = 2
RETRY_DELAY = 1.0


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _dist(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def shard_file_name(name: str, split: str, index: int, extension: str) -> str:
    """``NAME_SPLIT_000007.EXT``: zero-padded so that sorting file names gives manifest order."""
    return f"{name}_{split}_{index:06d}.{extension}"


def token_dtype(tokenizer: Tokenizer) -> np.dtype:
    """uint16 if every id the encoding can emit fits (max id < 2**16), else uint32."""
    # uint16 is enough for GPT-2's 50257 ids; cl100k's specials reach 100276, so it needs uint32.
    return TOKEN_DTYPES["uint16"] if tokenizer.max_token_value < 2**16 else TOKEN_DTYPES["uint32"]


@dataclass(frozen=True, kw_only=True)
class BuildPlan:
    """What a build will do; small enough to pass between orchestration tasks."""

    config: BuildConfig
    staging: str
    data_root: str
    catalog: str
    build_key: str
    inputs: tuple[InputFile, ...]
    units: tuple[WorkUnit, ...]
    dtype: str
    existing: str | None = None
    """``NAME@VERSION`` of an already published identical build; nothing to do then."""
    parent: str | None = None
    reuse: dict[str, Any] | None = None
    """An incremental build: ``{"parent": NAME@VERSION, "directory": ..., "inputs": {input index:
    the parent manifest's entry of that input}}``; those inputs get no work units, their tokens
    come from the parent's shards."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "build_format_version": BUILD_FORMAT_VERSION,
            "config": self.config.to_dict(),
            "staging": self.staging,
            "data_root": self.data_root,
            "catalog": self.catalog,
            "build_key": self.build_key,
            "inputs": [i.to_dict() for i in self.inputs],
            "units": [u.to_dict() for u in self.units],
            "dtype": self.dtype,
            "existing": self.existing,
            "parent": self.parent,
            "reuse": self.reuse,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BuildPlan":
        return cls(
            config=BuildConfig.from_dict(d["config"]),
            staging=d["staging"],
            data_root=d["data_root"],
            catalog=d["catalog"],
            build_key=d["build_key"],
            inputs=tuple(InputFile(**i) for i in d["inputs"]),
            units=tuple(WorkUnit(**u) for u in d["units"]),
            dtype=d["dtype"],
            existing=d.get("existing"),
            parent=d.get("parent"),
            reuse=d.get("reuse"),
        )


@dataclass(frozen=True, kw_only=True)
class UnitResult:
    """The counts of one tokenized work unit."""

    unit: int
    rows: int
    documents: int
    tokens: int
    nulls: int
    empties: int
    invalid_utf8: int
    skipped_invalid: int
    max_id: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _build_key(config: BuildConfig, inputs: list[InputFile], tokenizer: Tokenizer) -> str:
    payload = {
        "build_format_version": BUILD_FORMAT_VERSION,
        "config": config.key_fields(),
        "inputs": [[i.relname, i.size, i.sha256] for i in inputs],
        "tokenizer": [tokenizer.name, tokenizer.spec.rank_file_sha256, tokenizer.vocab_size],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _lock_path(staging: Path) -> Path:
    return staging.parent / f"{staging.name}.lock"


def _staging_lock(staging: Path, name: str, timeout: float | None) -> contextlib.AbstractContextManager[None]:
    return file_lock(_lock_path(staging), timeout=timeout, what=f"the build of {name!r} ({staging})", remove=True)


@contextlib.contextmanager
def build_lock(plan: BuildPlan, *, timeout: float | None = 0) -> Iterator[BuildPlan]:
    """Hold the lock of this build (its staging directory) while running its steps.

    One process at a time works on a staging directory: a second run of the same
    build fails at once with a message saying another is running (``timeout=0``,
    the default), or waits (``timeout`` seconds, ``None``: no limit). Builds of
    the same dataset with other inputs or options have other staging
    directories and run side by side; the catalog lock orders their publishes.
    ``build`` and the Prefect flow hold it from after ``plan_build`` to the end.

    Yields the plan as it is on disk now, with ``existing`` set if the build was
    published while this one waited: the caller then has nothing to do.
    """
    staging = Path(plan.staging)
    with _staging_lock(staging, plan.config.name, timeout):
        found = Catalog(plan.catalog).find_build(plan.config.name, plan.build_key)
        if found is not None:
            yield dataclasses.replace(plan, existing=f"{plan.config.name}@{found.version}")
        elif (staging / "plan.json").exists():
            yield dataclasses.replace(load_plan(staging), existing=None, parent=plan.parent)
        else:
            yield plan


_REUSE_FIELDS = frozenset(
    {"relname", "sha256", "size", "rows", "null_texts", "empty_texts", "invalid_utf8", "skipped_invalid_utf8", "max_token_id", "splits"}
)


def _plan_reuse(
    config: BuildConfig, inputs: list[InputFile], tokenizer: Tokenizer, dtype: np.dtype, cat: Catalog, prefer: str | None
) -> dict[str, Any] | None:
    """Which inputs an incremental build can take from the parent version unchanged (None: none).

    The parent is the catalog's latest version (or ``prefer``, the parent an
    interrupted run of this build had chosen). Its output-determining options
    must equal ours except for the inputs; an input is reused when the parent
    has one with the same name, size and SHA-256. With ``val_fraction`` (or no
    validation split) a document's split depends only on the seed, its input's
    name and its row, so a reused input's documents land in the same splits in
    the same order. ``val_count`` selects documents over the whole corpus, so it
    never reuses.
    """
    if config.val_count:
        return None
    versions = [v.version for v in cat.versions(config.name)]
    version = prefer.partition("@")[2] if prefer else None
    if version not in versions:
        version = cat.latest(config.name)
    if not version:
        return None
    ref = f"{config.name}@{version}"
    try:
        directory = cat.resolve(ref)
        parent = read_manifest(directory)
        parent_config = BuildConfig.from_dict(parent.config)
    except (ShardflowError, TypeError, ValueError, KeyError) as exc:
        log.warning("not reusing %s: %s", ref, exc)
        return None
    ours = {k: v for k, v in config.key_fields().items() if k != "embed"}
    theirs = {k: v for k, v in parent_config.key_fields().items() if k != "embed"}
    info = parent.tokenized_info
    if (
        ours != theirs
        or parent.format_name != config.format
        or parent.dtype != dtype.name
        or info.get("rank_file_sha256") != tokenizer.spec.rank_file_sha256
        or info.get("vocab_size") != tokenizer.vocab_size
        or parent.boundary.get("token_id") != tokenizer.eot_id
        or parent.boundary.get("placement") != config.boundary
    ):
        return None
    known = {(e["relname"], e["size"], e["sha256"]): e for e in parent.inputs if _REUSE_FIELDS <= set(e)}
    reused = {}
    for i, inp in enumerate(inputs):
        entry = known.get((inp.relname, inp.size, inp.sha256))
        if entry is not None:
            reused[str(i)] = entry
    if not reused:
        return None
    return {"parent": ref, "directory": str(directory), "build_key": parent.build_key, "inputs": reused}


def _reuse_signature(reuse: dict[str, Any] | None) -> Any:
    return None if not reuse else (reuse["parent"], sorted(reuse["inputs"]))


def _adopt_orphan(cat: Catalog, plan: BuildPlan, dataset_dir: Path) -> None:
    """Take back this build's version directory if a killed publish renamed it but never entered it.

    It goes back to ``out/`` of the staging directory (which the rename
    emptied), so the rerun validates and publishes it again instead of
    redoing it. An unlisted directory was never visible: the catalog entry is
    the commit point. (Another build's such directory waits for that build's
    rerun; ``publish`` steps past it.)
    """
    out = Path(plan.staging) / "out"
    if out.exists() or not dataset_dir.is_dir():
        return
    with cat.lock(plan.config.name):
        listed = {cat.version_dir(v) for v in cat.versions(plan.config.name)}
        for d in sorted(dataset_dir.iterdir()):
            if not re.fullmatch(r"v[0-9]+", d.name) or not d.is_dir() or d.resolve() in listed:
                continue
            try:
                orphan = read_manifest(d)
            except ShardflowError:
                continue
            if orphan.build_key == plan.build_key:
                os.replace(d, out)
                fsync_dir(dataset_dir)
                log.info("%s: this build's version, left unpublished by an interrupted publish; publishing it again", d)
                return


def _sweep_stale_tmp(staging: Path) -> None:
    """Delete temporary files of killed writers (``.NAME.tmp-PID`` of a process that is gone).

    Everywhere in the staging directory, and directly in the dataset directory
    (the input fingerprint cache).
    """
    found = list(staging.rglob(".*.tmp-*")) if staging.is_dir() else []
    found += list(staging.parent.parent.glob(".*.tmp-*"))
    for stray in found:
        if is_stale_tmp(stray):
            stray.unlink(missing_ok=True)


def plan_build(
    config: BuildConfig,
    *,
    data_root: str | os.PathLike[str] | None = None,
    catalog: str | os.PathLike[str] | None = None,
    reuse: bool | None = None,
    lock_timeout: float | None = 0,
) -> BuildPlan:
    """Find and fingerprint the inputs, cut work units, and prepare (or resume) the staging directory.

    Incremental: inputs unchanged since the parent version (the catalog's
    latest, if built with the same options) get no work units; their tokens are
    taken from the parent's shards (``reuse=False``, or ``SHARDFLOW_NO_REUSE=1``,
    rebuilds everything). The output is the same either way.

    Resuming: a staging directory left by an interrupted run of the same build
    is kept (its finished units, shards and files are reused), unless the plan
    changed, and then it is emptied. It holds the build's lock while it does
    so: if another run of the same build holds it, it fails at once with a
    message saying so (``lock_timeout``: waits that many seconds, ``None``: no
    limit, and reports the version the other run published).
    """
    root = default_data_root(data_root)
    cat = Catalog(default_catalog(catalog))
    fmt = get_format(config.format)
    tokenizer = load_tokenizer(config.tokenizer, backend=config.backend)
    dtype = token_dtype(tokenizer)
    fmt.check_dtype(dtype)
    inputs = discover_inputs(config.sources)
    dataset_dir = root / config.name
    inputs = fingerprint_inputs(inputs, cache_dir=dataset_dir)
    units = plan_units(inputs, text_column=config.text_column, id_column=config.id_column, unit_bytes=config.unit_bytes)
    if not units or sum(u.rows for u in units) == 0:
        raise InputError(f"the corpus is empty: {', '.join(config.sources)} hold no rows")
    key = _build_key(config, inputs, tokenizer)
    existing = cat.find_build(config.name, key)
    latest = cat.latest(config.name)
    staging = dataset_dir / ".staging" / key[:16]
    plan_file = staging / "plan.json"
    plan = BuildPlan(
        config=config,
        staging=str(staging),
        data_root=str(root),
        catalog=str(cat.path),
        build_key=key,
        inputs=tuple(inputs),
        units=tuple(units),
        dtype=str(dtype.name),
        existing=None,
        parent=f"{config.name}@{latest}" if latest else None,
    )
    if existing is not None:
        # A publish killed after its catalog entry leaves its staging directory behind.
        if staging.exists():
            try:
                with _staging_lock(staging, config.name, 0):
                    shutil.rmtree(staging, ignore_errors=True)
            except CatalogError:
                pass  # the run that published it is still cleaning up
        return dataclasses.replace(plan, existing=f"{config.name}@{existing.version}")
    # An interrupted run of this build chose its parent: keep it, so that its work stays valid.
    old = _read_old_plan(plan_file, key)
    if reuse is None:
        reuse = os.environ.get(NO_REUSE_ENV, "").strip() in ("", "0")
    reuse_info = (
        _plan_reuse(config, inputs, tokenizer, dtype, cat, (old.get("reuse") or {}).get("parent") if old else None)
        if reuse
        else None
    )
    if reuse_info:
        kept = [u for u in units if str(u.input) not in reuse_info["inputs"]]
        units = [dataclasses.replace(u, index=n) for n, u in enumerate(kept)]
    plan = dataclasses.replace(plan, units=tuple(units), reuse=reuse_info)
    staging.mkdir(parents=True, exist_ok=True)
    with _staging_lock(staging, config.name, lock_timeout):
        found = cat.find_build(config.name, key)
        if found is not None:  # published by another run while this one waited for the lock
            shutil.rmtree(staging, ignore_errors=True)
            return dataclasses.replace(plan, existing=f"{config.name}@{found.version}", reuse=None)
        plan = _prepare_staging(plan, cat, dataset_dir)
    fault("plan")
    return plan


def _read_old_plan(plan_file: Path, key: str) -> dict[str, Any] | None:
    """The plan an earlier run of this build left in its staging directory, if any."""
    if not plan_file.exists():
        return None
    try:
        old = json.loads(plan_file.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(old, dict) or old.get("build_key") != key or old.get("build_format_version") != BUILD_FORMAT_VERSION:
        return None
    return old


def _prepare_staging(plan: BuildPlan, cat: Catalog, dataset_dir: Path) -> BuildPlan:
    """Resume the staging directory of an interrupted run of this plan, or start it afresh (lock held)."""
    staging = Path(plan.staging)
    plan_file = staging / "plan.json"
    old = _read_old_plan(plan_file, plan.build_key)
    units = plan.units
    if (
        old is not None
        and old.get("units") == [u.to_dict() for u in units]
        and _reuse_signature(old.get("reuse")) == _reuse_signature(plan.reuse)
    ):
        # Resume: everything a previous run committed here is reused.
        plan = BuildPlan.from_dict({**old, "existing": None, "parent": plan.parent})
        _adopt_orphan(cat, plan, dataset_dir)
        _sweep_stale_tmp(staging)
    else:
        # A new plan (or one that changed: other work units or another parent):
        # nothing in this staging directory can be trusted. The old plan goes
        # first, so that a run killed while this is deleted starts afresh too.
        plan_file.unlink(missing_ok=True)
        for sub in ("parts", "layout", "out"):
            shutil.rmtree(staging / sub, ignore_errors=True)
        _sweep_stale_tmp(staging)
        atomic_write_text(plan_file, json.dumps(plan.to_dict(), indent=1))
        _adopt_orphan(cat, plan, dataset_dir)
    (staging / "parts").mkdir(exist_ok=True)
    return plan


@functools.lru_cache(maxsize=4)
def _load_plan_cached(path: str, mtime_ns: int) -> BuildPlan:
    return BuildPlan.from_dict(json.loads(Path(path).read_text()))


def load_plan(staging: str | os.PathLike[str]) -> BuildPlan:
    """The plan of a staging directory."""
    path = Path(staging) / "plan.json"
    if not path.exists():
        raise ConfigError(f"{staging}: no plan.json; run plan_build first")
    return _load_plan_cached(str(path), path.stat().st_mtime_ns)


def _part_paths(staging: Path, unit: int) -> tuple[Path, Path, Path]:
    stem = staging / "parts" / f"unit-{unit:06d}"
    return stem.with_suffix(".tok"), stem.with_suffix(".docs.npy"), stem.with_suffix(".json")


def _read_unit_result(path: Path) -> UnitResult:
    return UnitResult(**json.loads(path.read_text()))


def _rows_per_batch(cfg: BuildConfig, unit: WorkUnit) -> int:
    """Rows per batch so that a batch holds about ``batch_bytes`` of text (at most ``batch_rows``)."""
    if unit.rows == 0 or unit.text_bytes <= 0:
        return cfg.batch_rows
    return max(1, min(cfg.batch_rows, cfg.batch_bytes * unit.rows // unit.text_bytes))


def tokenize_unit(staging: str | os.PathLike[str], unit: int) -> UnitResult:
    """Tokenize one work unit into ``parts/``; a unit already done is not redone."""
    staging = Path(staging)
    plan = load_plan(staging)
    cfg = plan.config
    tok_path, docs_path, done_path = _part_paths(staging, unit)
    if done_path.exists():
        done = _read_unit_result(done_path)
        try:
            if tok_path.stat().st_size == done.tokens * np.dtype(plan.dtype).itemsize and docs_path.exists():
                return done
        except FileNotFoundError:
            pass
        log.warning("unit %d: its recorded result has no token file of the right size; tokenizing it again", unit)
        done_path.unlink(missing_ok=True)
    wu = plan.units[unit]
    inp = plan.inputs[wu.input]
    tokenizer = load_tokenizer(cfg.tokenizer, backend=cfg.backend)
    dtype = np.dtype(plan.dtype)
    counts = dict(rows=0, documents=0, tokens=0, nulls=0, empties=0, invalid_utf8=0, skipped_invalid=0, max_id=0)
    doc_chunks: list[np.ndarray] = []
    tmp_tok = tmp_path_for(tok_path)
    tmp_docs = tmp_path_for(docs_path)
    try:
        _tokenize_into(tmp_tok, tmp_docs, plan, wu, inp, tokenizer, dtype, counts, doc_chunks)
    except BaseException:
        # A failed unit (bad input, a full disk) leaves no temporary files behind.
        remove_quietly(tmp_tok)
        remove_quietly(tmp_docs)
        raise
    os.replace(tmp_tok, tok_path)
    os.replace(tmp_docs, docs_path)
    fault("tokenize-tokens", tok_path)
    result = UnitResult(unit=unit, **counts)
    atomic_write_text(done_path, json.dumps(result.to_dict()))  # the unit's commit point
    log.info("tokenized unit %d of %s: %d documents, %d tokens", unit, inp.relname, result.documents, result.tokens)
    fault("tokenize-done", done_path)
    return result


def _tokenize_into(
    tmp_tok: Path,
    tmp_docs: Path,
    plan: BuildPlan,
    wu: WorkUnit,
    inp: InputFile,
    tokenizer: Tokenizer,
    dtype: np.dtype,
    counts: dict[str, int],
    doc_chunks: list[np.ndarray],
) -> None:
    """Tokenize one unit into its temporary token file and document table (``tokenize_unit``)."""
    cfg = plan.config
    eot = tokenizer.eot_id
    limit = np.iinfo(dtype).max
    with open(tmp_tok, "wb") as out:
        for batch in iter_text_batches(
            inp, wu, text_column=cfg.text_column, batch_rows=_rows_per_batch(cfg, wu), utf8_errors=cfg.utf8_errors
        ):
            counts["rows"] += len(batch.rows) + batch.nulls + batch.empties + batch.skipped_invalid
            counts["nulls"] += batch.nulls
            counts["empties"] += batch.empties
            counts["invalid_utf8"] += batch.invalid_utf8
            counts["skipped_invalid"] += batch.skipped_invalid
            if len(batch.rows) == 0:
                continue
            # One reference encoding per batch guards the fast backend's exactness on live data.
            check_identity(tokenizer, [batch.texts[0].as_py()], where=f"{inp.path} row {int(batch.rows[0])}")
            tokens, offsets = tokenizer.encode_batch(batch.texts)
            if len(tokens):
                top = int(tokens.max())
                if top > limit:
                    bad = int(np.searchsorted(offsets, int(np.argmax(tokens)), side="right")) - 1
                    raise InputError(
                        f"{inp.path} row {int(batch.rows[bad])}: token id {top} does not fit {dtype.name}; "
                        "refusing to truncate it (this tokenizer needs uint32 shards)"
                    )
                counts["max_id"] = max(counts["max_id"], top)
            with_boundary = _with_boundaries(tokens, offsets, dtype, eot, bos=cfg.boundary == "bos")
            out.write(with_boundary.data)
            docs = np.empty(len(batch.rows), dtype=_DOC_DTYPE)
            docs["length"] = np.diff(offsets) + 1
            docs["row"] = batch.rows
            docs["score"] = split_scores(inp.relname, batch.rows, cfg.seed)
            doc_chunks.append(docs)
            counts["documents"] += len(docs)
            counts["tokens"] += len(with_boundary)
            fault("tokenize-batch", tmp_tok)
        out.flush()
        os.fsync(out.fileno())
    counts["max_id"] = max(counts["max_id"], eot) if counts["documents"] else counts["max_id"]
    docs_all = np.concatenate(doc_chunks) if doc_chunks else np.empty(0, dtype=_DOC_DTYPE)
    with open(tmp_docs, "wb") as f:
        np.save(f, docs_all)
        f.flush()
        os.fsync(f.fileno())


def _with_boundaries(tokens: np.ndarray, offsets: np.ndarray, dtype: np.dtype, eot: int, *, bos: bool) -> np.ndarray:
    """The documents' tokens with the boundary token before (BOS) or after (EOS) each one.

    Same result as ``np.insert(tokens, offsets[:-1] or offsets[1:], eot)``, about
    twice as fast: one scatter of the boundaries and one masked copy of the tokens.
    """
    ndocs = len(offsets) - 1
    out = np.empty(len(tokens) + ndocs, dtype=dtype)
    # Document i's boundary lands i places further than its offset: i boundaries precede it.
    where = (offsets[:-1] if bos else offsets[1:]) + np.arange(ndocs, dtype=np.int64)
    is_token = np.ones(len(out), dtype=bool)
    is_token[where] = False
    out[where] = eot
    out[is_token] = tokens
    return out


def _unit_docs(staging: Path, unit: int) -> np.ndarray:
    return np.load(_part_paths(staging, unit)[1], mmap_mode="r")


def _val_selection(plan: BuildPlan, staging: Path) -> tuple[int, int] | None:
    """For ``val_count``: the (score, global doc index) of the last selected document.

    Streams over units keeping at most ``val_count`` candidates, so memory is
    bounded by the count asked for, not by the corpus.
    """
    cfg = plan.config
    if not cfg.val_count:
        return None
    best_scores = np.empty(0, dtype=np.uint64)
    best_index = np.empty(0, dtype=np.int64)
    offset = 0
    for u in range(len(plan.units)):
        docs = _unit_docs(staging, u)
        scores = np.concatenate([best_scores, np.asarray(docs["score"])])
        index = np.concatenate([best_index, np.arange(offset, offset + len(docs), dtype=np.int64)])
        order = np.lexsort((index, scores))[: cfg.val_count]
        best_scores, best_index = scores[order], index[order]
        offset += len(docs)
    if cfg.val_count >= offset:
        raise InputError(
            f"val_count={cfg.val_count} leaves no training documents: the corpus has {offset} non-empty documents"
        )
    return int(best_scores[-1]), int(best_index[-1])


def _is_val(cfg: BuildConfig, docs: np.ndarray, first_index: int, cut: tuple[int, int] | None) -> np.ndarray:
    scores = np.asarray(docs["score"])
    if cfg.val_fraction:
        # score / 2**64 < fraction, computed exactly on integers
        return scores < np.uint64(min(int(cfg.val_fraction * 2.0**64), 2**64 - 1))
    if cut is not None:
        index = np.arange(first_index, first_index + len(docs), dtype=np.int64)
        s_cut, i_cut = np.uint64(cut[0]), cut[1]
        return (scores < s_cut) | ((scores == s_cut) & (index <= i_cut))
    return np.zeros(len(docs), dtype=bool)


def make_layout(staging: str | os.PathLike[str]) -> dict[str, int]:
    """Route documents to splits and plan the shards; returns ``{split: number of shards}``.

    A split's token stream is a list of segments (unit, first token, length)
    of the part files, and its document starts are written to a sidecar; both
    are streamed, so memory does not grow with the corpus.
    """
    staging = Path(staging)
    plan = load_plan(staging)
    cfg = plan.config
    layout_dir = staging / "layout"
    done = layout_dir / "layout.json"
    if done.exists():
        return {k: v["shards"] for k, v in json.loads(done.read_text())["splits"].items()}
    # Each finished unit is only checked (its files are in place); a missing one is tokenized here.
    results = [tokenize_unit(staging, u) for u in range(len(plan.units))]
    reused: dict[str, dict[str, Any]] = (plan.reuse or {}).get("inputs", {})
    total_docs = sum(r.documents for r in results) + sum(
        sum(r["documents"] for r in e["splits"].values()) for e in reused.values()
    )
    if total_docs == 0:
        nulls = sum(r.nulls for r in results) + sum(e["null_texts"] for e in reused.values())
        empties = sum(r.empties for r in results) + sum(e["empty_texts"] for e in reused.values())
        rows = sum(r.rows for r in results) + sum(e["rows"] for e in reused.values())
        raise InputError(
            f"the corpus has no text to tokenize: every one of its {rows} rows in column "
            f"{cfg.text_column!r} is null ({nulls}) or empty ({empties}); check --text-column"
        )
    cut = _val_selection(plan, staging)
    layout_dir.mkdir(exist_ok=True)
    splits = ("train", "val") if cfg.has_val else ("train",)
    seg_lists: dict[str, list[np.ndarray]] = {s: [] for s in splits}
    totals = {s: {"tokens": 0, "documents": 0} for s in splits}
    units_of: dict[int, list[int]] = {}
    for u, wu in enumerate(plan.units):
        units_of.setdefault(wu.input, []).append(u)
    per_input: list[dict[str, dict[str, int]]] = []
    starts_tmp = {s: tmp_path_for(layout_dir / f"{s}.starts.i64") for s in splits}
    starts_files = {s: open(starts_tmp[s], "wb") for s in splits}
    try:
        first_index = 0
        for i in range(len(plan.inputs)):
            mark = {s: (totals[s]["tokens"], totals[s]["documents"]) for s in splits}
            entry = reused.get(str(i))
            if entry is not None:
                # An unchanged input: its tokens are a range of the parent's split stream.
                for split in splits:
                    rng = entry["splits"].get(split)
                    if not rng or not rng["tokens"]:
                        continue
                    first, ntok = int(rng["first_token"]), int(rng["tokens"])
                    starts = _parent_doc_starts(plan, split, first, ntok)
                    if len(starts) != rng["documents"] or (len(starts) and starts[0] != first):
                        raise ValidationError(
                            f"{plan.reuse['directory']}: the .bos.idx files of split {split!r} list {len(starts)} "
                            f"document starts for input {entry['relname']} (tokens {first} to {first + ntok}), its "
                            f"manifest says {rng['documents']}; the parent version {plan.reuse['parent']} is damaged. "
                            f"Check it with `shardflow validate {plan.reuse['parent']}`, or rebuild without reusing "
                            f"it: {NO_REUSE_ENV}=1"
                        )
                    seg = np.empty(1, dtype=_SEGMENT_DTYPE)
                    seg["unit"] = -1 - SPLITS.index(split)
                    seg["start"] = first
                    seg["length"] = ntok
                    seg_lists[split].append(seg)
                    starts_files[split].write((starts - first + totals[split]["tokens"]).astype("<i8").tobytes())
                    totals[split]["tokens"] += ntok
                    totals[split]["documents"] += len(starts)
            for u in units_of.get(i, []):
                docs = _unit_docs(staging, u)
                n = len(docs)
                if n == 0:
                    continue
                lengths = np.asarray(docs["length"], dtype=np.int64)
                src_starts = np.zeros(n, dtype=np.int64)
                np.cumsum(lengths[:-1], out=src_starts[1:])
                val = _is_val(cfg, docs, first_index, cut) if cfg.has_val else np.zeros(n, dtype=bool)
                first_index += n
                for split, mask in (("train", ~val), ("val", val)):
                    if split not in seg_lists or not mask.any():
                        continue
                    # Runs of consecutive documents of this split become one segment each.
                    idx = np.flatnonzero(mask)
                    run_start = np.concatenate(([True], np.diff(idx) != 1))
                    firsts = idx[run_start]
                    lasts = idx[np.concatenate((run_start[1:], [True]))]
                    seg = np.empty(len(firsts), dtype=_SEGMENT_DTYPE)
                    seg["unit"] = u
                    seg["start"] = src_starts[firsts]
                    seg["length"] = src_starts[lasts] + lengths[lasts] - src_starts[firsts]
                    seg_lists[split].append(seg)
                    split_lengths = lengths[idx]
                    doc_starts = np.empty(len(idx), dtype=np.int64)
                    doc_starts[0] = 0
                    np.cumsum(split_lengths[:-1], out=doc_starts[1:])
                    doc_starts += totals[split]["tokens"]
                    # A document starts at its first token with either placement (EOS closes it).
                    starts_files[split].write(doc_starts.astype("<i8").tobytes())
                    totals[split]["tokens"] += int(split_lengths.sum())
                    totals[split]["documents"] += len(idx)
            # Where this input's documents are in each split's stream: what an
            # incremental build that reuses the input takes from this version.
            per_input.append(
                {
                    s: {
                        "first_token": mark[s][0],
                        "tokens": totals[s]["tokens"] - mark[s][0],
                        "first_document": mark[s][1],
                        "documents": totals[s]["documents"] - mark[s][1],
                    }
                    for s in splits
                }
            )
    except BaseException:
        for f in starts_files.values():
            f.close()
        for t in starts_tmp.values():
            remove_quietly(t)
        raise
    for f in starts_files.values():
        f.flush()
        os.fsync(f.fileno())
        f.close()
    if cfg.has_val and totals["val"]["documents"] == 0:
        log.warning(
            "the val split is empty: val_fraction=%s selects none of the corpus's %d documents; "
            "raise --val-fraction or use --val-count N",
            cfg.val_fraction,
            totals["train"]["documents"],
        )
    info: dict[str, Any] = {"splits": {}, "inputs": per_input}
    for split in splits:
        segs = np.concatenate(seg_lists[split]) if seg_lists[split] else np.empty(0, dtype=_SEGMENT_DTYPE)
        tmp = tmp_path_for(layout_dir / f"{split}.segments.npy")
        try:
            with open(tmp, "wb") as f:
                np.save(f, segs)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            remove_quietly(tmp)
            for t in starts_tmp.values():
                remove_quietly(t)
            raise
        os.replace(tmp, layout_dir / f"{split}.segments.npy")
        os.replace(starts_tmp[split], layout_dir / f"{split}.starts.i64")
        tokens = totals[split]["tokens"]
        nshards = -(-tokens // cfg.shard_tokens)
        info["splits"][split] = {**totals[split], "shards": nshards}
    fault("layout", done)
    atomic_write_text(done, json.dumps(info))
    return {k: v["shards"] for k, v in info["splits"].items()}


@functools.lru_cache(maxsize=8)
def _parent_manifest_cached(directory: str, mtime_ns: int) -> Manifest:
    return read_manifest(Path(directory))


def _parent_version(plan: BuildPlan) -> tuple[Path, Manifest]:
    """The directory and manifest of the version an incremental build reuses inputs from."""
    if not plan.reuse:
        raise ConfigError(f"{plan.staging}: the layout names the parent version, but the plan reuses none")
    directory = Path(plan.reuse["directory"])
    try:
        manifest = _parent_manifest_cached(str(directory), (directory / "metadata.yaml").stat().st_mtime_ns)
    except (OSError, ShardflowError) as exc:
        raise ValidationError(
            f"{directory}: the parent version {plan.reuse['parent']} this build reuses cannot be read ({exc}); "
            f"rebuild without reusing it: {NO_REUSE_ENV}=1"
        ) from None
    if manifest.build_key != plan.reuse["build_key"]:
        raise ValidationError(
            f"{directory}: the manifest of {plan.reuse['parent']} changed since this build was planned (another build "
            f"key); versions are immutable. Check it with `shardflow validate {plan.reuse['parent']}`"
        )
    return directory, manifest


def _split_offsets(entry: SplitEntry) -> np.ndarray:
    return np.concatenate(([0], np.cumsum([s.tokens for s in entry.shards], dtype=np.int64)))


def _parent_damaged(plan: BuildPlan, path: Path, what: str) -> ValidationError:
    ref = plan.reuse["parent"] if plan.reuse else "the parent version"
    return ValidationError(
        f"{path}: {what}; the parent version {ref} this build reuses is damaged. Check it with "
        f"`shardflow validate {ref}`, or rebuild without reusing it: {NO_REUSE_ENV}=1"
    )


def _parent_doc_starts(plan: BuildPlan, split: str, first: int, ntokens: int) -> np.ndarray:
    """Document starts (parent split coordinates) in tokens ``[first, first + ntokens)`` of the parent."""
    directory, parent = _parent_version(plan)
    entry = parent.splits[split]
    offsets = _split_offsets(entry)
    end = first + ntokens
    pieces = []
    k = int(np.searchsorted(offsets, first, side="right")) - 1
    while k < len(entry.shards) and offsets[k] < end:
        shard = entry.shards[k]
        path = directory / shard.index.file
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise _parent_damaged(plan, path, f"cannot read the index ({exc.strerror})") from None
        if hashlib.sha256(raw).hexdigest() != shard.index.sha256:
            raise _parent_damaged(plan, path, "the index does not match its SHA-256 in the manifest")
        starts = bosidx.read(path, shard.tokens).astype(np.int64) + offsets[k]
        pieces.append(starts[(starts >= first) & (starts < end)])
        k += 1
    return np.concatenate(pieces) if pieces else np.empty(0, dtype=np.int64)


_verified: set[tuple[str, int, int, int]] = set()
_verified_lock = threading.Lock()


def _verified_parent_shard(plan: BuildPlan, path: Path, shard: ShardEntry, itemsize: int) -> int:
    """Check a parent shard against its manifest entry (size and SHA-256, once per process); returns its header size.

    Tokens copied from the parent into a new shard are hashed as part of the new
    shard, so a damaged parent must be caught here, before its bytes are copied.
    """
    try:
        st = path.stat()
    except OSError as exc:
        raise _parent_damaged(plan, path, f"cannot read the shard ({exc.strerror})") from None
    if st.st_size != shard.bytes:
        raise _parent_damaged(plan, path, f"{st.st_size} bytes, but its manifest says {shard.bytes}")
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    with _verified_lock:
        known = key in _verified
    if not known:
        with open(path, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        if digest != shard.sha256:
            raise _parent_damaged(plan, path, "the shard does not match its SHA-256 in the manifest")
        with _verified_lock:
            _verified.add(key)
    return shard.bytes - shard.tokens * itemsize


def _layout_info(staging: Path) -> dict[str, Any]:
    return json.loads((staging / "layout" / "layout.json").read_text())


def _shard_result_path(staging: Path, split: str, k: int) -> Path:
    return staging / "layout" / f"{split}-{k:06d}.shard.json"


def _in_place(out_dir: Path, entry: dict[str, Any]) -> bool:
    """Whether a shard's files recorded as done are still in ``out/`` with their recorded sizes."""
    try:
        return (out_dir / entry["file"]).stat().st_size == entry["bytes"] and (
            out_dir / entry["index"]["file"]
        ).stat().st_size == entry["index"]["bytes"]
    except (OSError, KeyError, TypeError):
        return False


def _copy_exact(src: Any, out: Any, h: Any, buf: np.ndarray, count: int) -> None:
    """Copy ``count`` tokens from the open file ``src`` to ``out`` through ``buf``, hashing them."""
    done_tokens = 0
    while done_tokens < count:
        n = min(len(buf), count - done_tokens)
        view = memoryview(buf[:n]).cast("B")
        if src.readinto(view) != len(view):
            raise ValidationError(f"{src.name}: shorter than the layout says; the staging area is damaged")
        out.write(view)
        h.update(view)
        done_tokens += n


def _copy_parent_range(out: Any, h: Any, buf: np.ndarray, plan: BuildPlan, split: str, start: int, count: int) -> None:
    """Copy tokens ``[start, start + count)`` of the parent's ``split`` stream, across its shard boundaries."""
    directory, parent = _parent_version(plan)
    entry = parent.splits[split]
    offsets = _split_offsets(entry)
    k = int(np.searchsorted(offsets, start, side="right")) - 1
    pos, end = start, start + count
    while pos < end:
        if k >= len(entry.shards):
            raise _parent_damaged(plan, directory, f"split {split!r} has fewer tokens than this build expects")
        shard = entry.shards[k]
        path = directory / shard.file
        header_bytes = _verified_parent_shard(plan, path, shard, buf.dtype.itemsize)
        take = min(end, int(offsets[k + 1])) - pos
        with open(path, "rb") as src:
            src.seek(header_bytes + (pos - int(offsets[k])) * buf.dtype.itemsize)
            _copy_exact(src, out, h, buf, take)
        pos += take
        k += 1


def _link_or_copy(src: Path, dest: Path) -> None:
    """Put ``src``'s file at ``dest`` atomically: a hard link, or a copy across filesystems."""
    tmp = tmp_path_for(dest)
    remove_quietly(tmp)
    try:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
    except BaseException:
        remove_quietly(tmp)
        raise


def _same_parent_shard(plan: BuildPlan, pieces: list[tuple[int, int, int]], ntokens: int) -> tuple[Path, ShardEntry] | None:
    """The parent shard whose tokens are exactly those of the new shard made of ``pieces``, if any."""
    if not plan.reuse or not pieces or pieces[0][0] >= 0:
        return None
    code = pieces[0][0]
    for (u, lo, n), (u2, lo2, _) in zip(pieces, pieces[1:]):
        if u2 != code or lo2 != lo + n:
            return None  # not one contiguous range of one parent split
    directory, parent = _parent_version(plan)
    entry = parent.splits[SPLITS[-1 - code]]
    offsets = _split_offsets(entry)
    j = int(np.searchsorted(offsets, pieces[0][1], side="left"))
    if j < len(entry.shards) and offsets[j] == pieces[0][1] and entry.shards[j].tokens == ntokens:
        return directory, entry.shards[j]
    return None


def write_shard(staging: str | os.PathLike[str], split: str, k: int) -> dict[str, Any]:
    """Write shard ``k`` of ``split`` and its ``.bos.idx`` into ``out/``; returns its manifest entry.

    In an incremental build, a shard whose tokens are exactly one shard of the
    parent version (same split, same range, so the same bytes) is hard-linked
    from the parent instead of written, and so is its index when identical.
    """
    staging = Path(staging)
    done = _shard_result_path(staging, split, k)
    out_dir = staging / "out"
    if done.exists():
        entry = json.loads(done.read_text())
        if _in_place(out_dir, entry):
            return entry
    plan = load_plan(staging)
    cfg = plan.config
    fmt = get_format(cfg.format)
    dtype = np.dtype(plan.dtype)
    info = _layout_info(staging)["splits"][split]
    lo = k * cfg.shard_tokens
    hi = min(lo + cfg.shard_tokens, info["tokens"])
    if not 0 <= lo < hi:
        raise ConfigError(f"{split} has {info['shards']} shards; there is no shard {k}")
    segs = np.load(staging / "layout" / f"{split}.segments.npy", mmap_mode="r")
    seg_ends = np.cumsum(np.asarray(segs["length"], dtype=np.int64))
    seg_starts = seg_ends - np.asarray(segs["length"], dtype=np.int64)
    # The shard's tokens as pieces (source, first source token, count): a part
    # file of a work unit (source >= 0) or a range of a parent split (< 0).
    pieces: list[tuple[int, int, int]] = []
    s = int(np.searchsorted(seg_ends, lo, side="right"))
    pos = lo
    while pos < hi:
        seg_off = pos - int(seg_starts[s])
        take = min(int(segs["length"][s]) - seg_off, hi - pos)
        pieces.append((int(segs["unit"][s]), int(segs["start"][s]) + seg_off, take))
        pos += take
        s += 1
    out_dir.mkdir(exist_ok=True)
    shard_path = out_dir / shard_file_name(cfg.name, split, k, fmt.extension)
    idx_path = bosidx.index_path(shard_path)
    starts = np.memmap(staging / "layout" / f"{split}.starts.i64", dtype="<i8", mode="r")
    a, b = np.searchsorted(starts, [lo, hi], side="left")
    local = np.asarray(starts[a:b], dtype=np.int64) - lo
    idx_bytes = bosidx.encode(local)
    idx_sha = hashlib.sha256(idx_bytes).hexdigest()
    same = _same_parent_shard(plan, pieces, hi - lo)
    linked = same is not None
    if same is not None:
        directory, parent_shard = same
        header_len = len(fmt.header(hi - lo, dtype))
        if parent_shard.bytes != header_len + (hi - lo) * dtype.itemsize:
            raise _parent_damaged(plan, directory / parent_shard.file, "its manifest entry does not fit its format")
        _link_or_copy(directory / parent_shard.file, shard_path)
        fault("shard-linked", shard_path)
        nbytes, digest = parent_shard.bytes, parent_shard.sha256
    else:
        header = fmt.header(hi - lo, dtype)
        tmp = tmp_path_for(shard_path)
        h = hashlib.sha256()
        # Copy through one bounded buffer with plain reads: memory-mapping the parts
        # would count every copied page towards the process's resident memory.
        buf = np.empty(min(_BLOCK_TOKENS, hi - lo), dtype=dtype)
        try:
            with open(tmp, "wb") as f:
                f.write(header)
                h.update(header)
                for n, (unit, src_lo, take) in enumerate(pieces):
                    if unit >= 0:
                        with open(_part_paths(staging, unit)[0], "rb") as part:
                            part.seek(src_lo * dtype.itemsize)
                            _copy_exact(part, f, h, buf, take)
                    else:
                        _copy_parent_range(f, h, buf, plan, SPLITS[-1 - unit], src_lo, take)
                    if n == 0:
                        fault("shard-mid", tmp)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, shard_path)
        except BaseException:
            remove_quietly(tmp)  # a failed write (a full disk) leaves no temporary file
            raise
        fault("shard-written", shard_path)
        nbytes, digest = len(header) + (hi - lo) * dtype.itemsize, h.hexdigest()
    if same is not None and same[1].index.sha256 == idx_sha:
        _link_or_copy(same[0] / same[1].index.file, idx_path)
    else:
        tmp_idx = tmp_path_for(idx_path)
        try:
            with open(tmp_idx, "wb") as f:
                f.write(idx_bytes)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp_idx, idx_path)
        except BaseException:
            remove_quietly(tmp_idx)
            raise
    fault("shard-indexed", idx_path)
    entry = ShardEntry(
        file=shard_path.name,
        bytes=nbytes,
        sha256=digest,
        tokens=hi - lo,
        documents=len(local),
        index=FileEntry(file=idx_path.name, bytes=len(idx_bytes), sha256=idx_sha),
    ).to_dict()
    entry["linked"] = linked
    atomic_write_text(done, json.dumps(entry))
    log.info("%s %s shard %d (%d tokens)", "linked" if linked else "wrote", split, k, hi - lo)
    return entry


def _tools(tokenizer: Tokenizer) -> dict[str, Any]:
    return {
        "shardflow": __version__,
        **tokenizer.library_versions(),
        "numpy": np.__version__,
        "pyarrow": _dist("pyarrow"),
        "python": platform.python_version(),
    }


def _copy_rank_file(tokenizer: Tokenizer, out: Path) -> str | None:
    """Put a user's local ``.tiktoken`` rank file into ``out/`` under its own name; returns that name."""
    spec = tokenizer.spec
    if not spec.local_file or spec.rank_file is None:
        return None
    # The stem selects the split pattern of a known encoding (cl100k_base.tiktoken), so keep the name.
    dest = out / Path(spec.rank_file).name
    if not (dest.exists() and sha256_file(dest) == spec.rank_file_sha256):
        out.mkdir(exist_ok=True)
        tmp = tmp_path_for(dest)
        try:
            shutil.copyfile(spec.rank_file, tmp)  # a copy, not a link: editing the original must not change a version
            os.replace(tmp, dest)
        except BaseException:
            remove_quietly(tmp)
            raise
        if sha256_file(dest) != spec.rank_file_sha256:
            raise InputError(
                f"{spec.rank_file}: the rank file changed during the build (its SHA-256 differs from when the "
                "build started); keep it unchanged and run the build again"
            )
    return dest.name


def staged_manifest(staging: str | os.PathLike[str]) -> Manifest:
    """The manifest of a staged build (version not yet assigned)."""
    staging = Path(staging)
    plan = load_plan(staging)
    cfg = plan.config
    fmt = get_format(cfg.format)
    tokenizer = load_tokenizer(cfg.tokenizer, backend=cfg.backend)
    info = _layout_info(staging)
    results = [_read_unit_result(_part_paths(staging, u)[2]) for u in range(len(plan.units))]
    splits: dict[str, SplitEntry] = {}
    linked = 0
    for split, sinfo in info["splits"].items():
        written = [write_shard(staging, split, k) for k in range(sinfo["shards"])]
        linked += sum(1 for w in written if w.get("linked"))
        shards = tuple(ShardEntry.from_dict(w, f"{split} shard {k}") for k, w in enumerate(written))
        splits[split] = SplitEntry(documents=sinfo["documents"], tokens=sinfo["tokens"], shards=shards)
    # Per input: its counts (from its work units, or from the parent version for
    # a reused input) and where its documents are in each split's stream.
    counted = ("rows", "null_texts", "empty_texts", "invalid_utf8", "skipped_invalid_utf8", "max_token_id")
    per_input = [dict.fromkeys(counted, 0) for _ in plan.inputs]
    for r in results:
        c = per_input[plan.units[r.unit].input]
        c["rows"] += r.rows
        c["null_texts"] += r.nulls
        c["empty_texts"] += r.empties
        c["invalid_utf8"] += r.invalid_utf8
        c["skipped_invalid_utf8"] += r.skipped_invalid
        c["max_token_id"] = max(c["max_token_id"], r.max_id)
    reused = (plan.reuse or {}).get("inputs", {})
    for key, entry in reused.items():
        per_input[int(key)] = {k: int(entry[k]) for k in counted}
    totals = {
        "documents": sum(s.documents for s in splits.values()),
        "tokens": sum(s.tokens for s in splits.values()),
        "shards": sum(len(s.shards) for s in splits.values()),
        "bytes": sum(sh.bytes + sh.index.bytes for s in splits.values() for sh in s.shards),
        "input_rows": sum(c["rows"] for c in per_input),
        "null_texts": sum(c["null_texts"] for c in per_input),
        "empty_texts": sum(c["empty_texts"] for c in per_input),
        "invalid_utf8": sum(c["invalid_utf8"] for c in per_input),
        "skipped_invalid_utf8": sum(c["skipped_invalid_utf8"] for c in per_input),
        "max_token_id": max(c["max_token_id"] for c in per_input),
    }
    # A local rank file travels with the version, so that it decodes anywhere.
    rank_copy = _copy_rank_file(tokenizer, staging / "out")
    extra: dict[str, Any] = {}
    if plan.reuse:
        extra["reuse"] = {
            "parent": plan.reuse["parent"],
            "reused_inputs": [plan.inputs[int(i)].relname for i in sorted(reused, key=int)],
            "tokenized_inputs": [
                inp.relname for n, inp in enumerate(plan.inputs) if str(n) not in reused
            ],
            "linked_shards": linked,
        }
    return Manifest(
        schema_version=SCHEMA_VERSION,
        name=cfg.name,
        version="",
        description=cfg.description,
        dataset_path="",
        data_content="text",
        content_field=cfg.text_column,
        tokenized_info={
            "tokenizer": tokenizer.name,
            "file_prefix": f"{cfg.name}_",
            "dtype": plan.dtype,
            "file_extension": fmt.extension,
            "vocab_size": tokenizer.vocab_size,
            "backend": tokenizer.backend,
            "rank_file_sha256": tokenizer.spec.rank_file_sha256,
            **({"rank_file": rank_copy} if rank_copy else {}),
        },
        parent_datasets=[],
        format={
            "name": fmt.name,
            "header_magic": fmt.header_magic,
            "header_bytes": len(fmt.header(0, np.dtype(plan.dtype))),
            "file_pattern": f"{cfg.name}_{{split}}_*.{fmt.extension}",
            "index_suffix": bosidx.BOS_IDX_SUFFIX,
        },
        boundary={"token": tokenizer.eot_token, "token_id": tokenizer.eot_id, "placement": cfg.boundary},
        splits=splits,
        totals=totals,
        inputs=[
            {**i.to_dict(), **per_input[n], "splits": info["inputs"][n]} for n, i in enumerate(plan.inputs)
        ],
        config=cfg.to_dict(),
        tools=_tools(tokenizer),
        build_key=plan.build_key,
        created_at=_now(),
        parent=plan.parent,
        extra=extra,
    )


def finalize(staging: str | os.PathLike[str]) -> Manifest:
    """Write the staged manifest into ``out/`` and validate the staged files against it."""
    from .validation import validate_dir

    staging = Path(staging)
    manifest = staged_manifest(staging)
    out = staging / "out"
    # A writer killed mid-file (an earlier, interrupted run) leaves its temporary
    # file behind; it must not be published with the version.
    for stray in out.glob(".*.tmp-*"):
        stray.unlink(missing_ok=True)
    write_manifest(out, manifest)
    fault("finalize-manifest", out)
    validate_dir(out, manifest, checksums=True)
    fault("finalize-done", out)
    return manifest


def publish(staging: str | os.PathLike[str]) -> str:
    """Publish a finalized build staging directory as the next version; returns ``NAME@VERSION``."""
    staging = Path(staging)
    plan = load_plan(staging)
    return publish_out(
        staging / "out",
        name=plan.config.name,
        build_key=plan.build_key,
        data_root=plan.data_root,
        catalog=plan.catalog,
        cleanup=staging,
    )


def publish_out(
    out: Path,
    *,
    name: str,
    build_key: str,
    data_root: str | os.PathLike[str],
    catalog: str | os.PathLike[str],
    parent: str | None = None,
    cleanup: Path | None = None,
) -> str:
    """Publish the complete version directory ``out`` (manifest inside); returns ``NAME@VERSION``.

    Under the dataset's catalog lock: pick the version name, stamp it into the
    manifest, rename ``out`` to ``<data_root>/<name>/<version>`` (atomic), then
    add the catalog entry (the commit point). An identical version (same build
    key) already in the catalog wins, and nothing new is published. ``parent``
    defaults to the catalog's latest version. ``cleanup`` is removed afterwards.
    """
    cat = Catalog(catalog)
    out = Path(out)
    with cat.lock(name):
        existing = cat.find_build(name, build_key)
        if existing is not None:
            if cleanup is not None:
                shutil.rmtree(cleanup, ignore_errors=True)
            return f"{name}@{existing.version}"
        dataset_dir = Path(data_root) / name
        version = cat.next_version(name)
        final = dataset_dir / version
        # A directory left by a publish that died after its rename but before its
        # catalog entry: adopt it if it is this build, else step past it.
        while final.exists():
            try:
                orphan = read_manifest(final)
            except Exception:
                orphan = None
            if orphan is not None and orphan.build_key == build_key and not out.exists():
                break
            version = f"v{int(version[1:]) + 1}"
            final = dataset_dir / version
        if not final.exists():
            manifest = read_manifest(out)
            if parent is None:
                latest = cat.latest(name)
                parent = f"{name}@{latest}" if latest else None
            manifest = manifest.replace(version=version, dataset_path=str(final), parent=parent)
            write_manifest(out, manifest)
            fault("publish-stamped", out)
            os.replace(out, final)
            fsync_dir(dataset_dir)
            fault("publish-renamed", final)
        manifest = read_manifest(final)
        manifest_sha = sha256_file(final / MANIFEST_NAME)
        cat.add(
            name,
            VersionEntry(
                version=version,
                path=str(final),
                created_at=manifest.created_at,
                build_key=build_key,
                parent=manifest.parent,
                totals={k: manifest.totals[k] for k in ("documents", "tokens", "shards", "bytes")},
                manifest_sha256=manifest_sha,
            ),
        )
        fault("publish-cataloged", final)
    if cleanup is not None:
        shutil.rmtree(cleanup, ignore_errors=True)
    log.info("published %s@%s at %s", name, version, final)
    return f"{name}@{version}"


def embed_staged(staging: str | os.PathLike[str]) -> Manifest:
    """The embedding stage of a build (``config.embed``): embed, record, validate; idempotent."""
    from .embeddings import add_embeddings, validate_embeddings

    staging = Path(staging)
    plan = load_plan(staging)
    out = staging / "out"
    manifest = read_manifest(out)
    if plan.config.embed is None or "embeddings" in manifest.extra:
        return manifest
    manifest = add_embeddings(out, manifest, plan.config.embed)
    problems = validate_embeddings(out, manifest)
    if problems:
        raise ValidationError("\n  ".join([f"embeddings of {plan.config.name} failed validation:", *problems]))
    write_manifest(out, manifest)
    return manifest


def embed_version(
    ref: str,
    options: "EmbedOptions",
    *,
    catalog: str | os.PathLike[str] | None = None,
    data_root: str | os.PathLike[str] | None = None,
) -> "BuildResult":
    """Add embeddings to the published version ``ref`` as a new version whose parent is ``ref``.

    The token shards and indexes are hard-linked from the parent (no copies;
    a copy only where the data root is on another filesystem).
    """
    from .embeddings import add_embeddings, check_embed_options, embedding_key, validate_embeddings

    cat = Catalog(default_catalog(catalog))
    src_dir = cat.resolve(ref)
    parent = read_manifest(src_dir)
    check_embed_options(parent, options)  # before anything is staged
    key = embedding_key(parent.build_key, options)
    existing = cat.find_build(parent.name, key)
    if existing is not None:
        found = f"{parent.name}@{existing.version}"
        return BuildResult(ref=found, manifest_path=str(cat.version_dir(existing) / "metadata.yaml"), created=False)
    root = Path(data_root) if data_root is not None else src_dir.parent.parent
    staging = root / parent.name / ".staging" / f"emb-{key[:16]}"
    out = staging / "out"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    names = [name for entry in parent.splits.values() for shard in entry.shards for name in (shard.file, shard.index.file)]
    if parent.tokenized_info.get("rank_file"):
        names.append(parent.tokenized_info["rank_file"])
    for name in names:
        try:
            os.link(src_dir / name, out / name)
        except OSError:
            shutil.copy2(src_dir / name, out / name)
    base = parent.replace(
        splits={k: SplitEntry(documents=v.documents, tokens=v.tokens, shards=v.shards, extra={}) for k, v in parent.splits.items()},
        extra={k: v for k, v in parent.extra.items() if k != "embeddings"},
        config={**parent.config, "embed": options.to_dict()},
        build_key=key,
        created_at=_now(),
    )
    manifest = add_embeddings(out, base, options)
    problems = validate_embeddings(out, manifest)
    if problems:
        shutil.rmtree(staging, ignore_errors=True)
        raise ValidationError("\n  ".join([f"embeddings of {ref} failed validation:", *problems]))
    write_manifest(out, manifest)
    new_ref = publish_out(
        out, name=parent.name, build_key=key, data_root=root, catalog=cat.path, parent=parent.ref, cleanup=staging
    )
    return BuildResult(ref=new_ref, manifest_path=str(cat.resolve(new_ref) / "metadata.yaml"), created=True)


@dataclass(frozen=True, kw_only=True)
class BuildResult:
    """What a build did: the published reference and where its manifest is."""

    ref: str
    manifest_path: str
    created: bool
    """False when an identical version already existed and nothing was published."""


_T = TypeVar("_T")


def retrying(step: Callable[..., _T], *args: Any, retries: int | None = None, **kwargs: Any) -> _T:
    """Run a build step, retrying it up to ``retries`` (``STEP_RETRIES``) times on a transient I/O error.

    Steps are idempotent, so a retry redoes only what did not finish. Bad input
    and configuration errors (``ShardflowError``), and I/O errors that need a
    person (a full disk, a missing path, permissions), are raised at once: see
    ``errors.is_transient``.
    """
    retries = STEP_RETRIES if retries is None else retries
    for attempt in range(retries + 1):
        try:
            return step(*args, **kwargs)
        except OSError as exc:
            if attempt >= retries or not is_transient(exc):
                raise
            log.warning(
                "%s: transient I/O error (%s); retry %d of %d", getattr(step, "__name__", step), exc, attempt + 1, retries
            )
            time.sleep(RETRY_DELAY * (attempt + 1))
    raise AssertionError("unreachable")


def build(
    config: BuildConfig,
    *,
    data_root: str | os.PathLike[str] | None = None,
    catalog: str | os.PathLike[str] | None = None,
    workers: int = 1,
    on_unit: Callable[[UnitResult], None] | None = None,
    lock_timeout: float | None = 0,
    reuse: bool | None = None,
) -> BuildResult:
    """Run the whole pipeline in this process, ``workers`` threads wide (no Prefect needed).

    Holds the build's ``build_lock`` throughout: a second run of the same build
    fails at once with a clear message (``lock_timeout`` seconds: waits, and
    then reports the version the other run published). Transient I/O errors
    are retried per step (``retrying``).
    """
    if workers < 1:
        raise ConfigError(f"workers must be at least 1, not {workers}")
    plan = retrying(plan_build, config, data_root=data_root, catalog=catalog, reuse=reuse, lock_timeout=lock_timeout)
    cat = Catalog(plan.catalog)
    if plan.existing:
        return BuildResult(ref=plan.existing, manifest_path=str(cat.resolve(plan.existing) / "metadata.yaml"), created=False)
    with build_lock(plan, timeout=lock_timeout) as plan:
        if plan.existing:
            return BuildResult(ref=plan.existing, manifest_path=str(cat.resolve(plan.existing) / "metadata.yaml"), created=False)
        staging = plan.staging
        pool = ThreadPoolExecutor(max_workers=workers)
        try:
            for result in pool.map(lambda u: retrying(tokenize_unit, staging, u), range(len(plan.units))):
                if on_unit is not None:
                    on_unit(result)
            layout = retrying(make_layout, staging)
            jobs = [(s, k) for s, n in layout.items() for k in range(n)]
            list(pool.map(lambda sk: retrying(write_shard, staging, *sk), jobs))
        finally:
            # On the first error, queued work is dropped (what finished is kept for the rerun).
            pool.shutdown(wait=True, cancel_futures=True)
        retrying(finalize, staging)
        embed_staged(staging)
        ref = retrying(publish, staging)
    return BuildResult(ref=ref, manifest_path=str(cat.resolve(ref) / "metadata.yaml"), created=True)
