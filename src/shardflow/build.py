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

import datetime as _dt
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from . import __version__
from ._io import atomic_write_text, fsync_dir, tmp_path_for
from .catalog import Catalog, VersionEntry, default_catalog, default_data_root, file_lock
from .config import BuildConfig, EmbedOptions
from .errors import ConfigError, InputError, ValidationError
from .formats import bosidx, get_format
from .formats.base import TOKEN_DTYPES
from .manifest import SCHEMA_VERSION, Manifest, ShardEntry, SplitEntry, FileEntry, read_manifest, write_manifest
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
    "BuildResult",
    "shard_file_name",
]

log = logging.getLogger("shardflow.build")

# Work is streamed in blocks of this many tokens so memory stays bounded
# whatever the shard size (16 Mi tokens = 64 MiB of uint32).
_BLOCK_TOKENS = 16 << 20
_DOC_DTYPE = np.dtype([("length", "<i8"), ("row", "<i8"), ("score", "<u8")])
_SEGMENT_DTYPE = np.dtype([("unit", "<i8"), ("start", "<i8"), ("length", "<i8")])
BUILD_FORMAT_VERSION = 1


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


def plan_build(
    config: BuildConfig,
    *,
    data_root: str | os.PathLike[str] | None = None,
    catalog: str | os.PathLike[str] | None = None,
) -> BuildPlan:
    """Find and fingerprint the inputs, cut work units, and prepare (or reuse) the staging directory."""
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
    plan = BuildPlan(
        config=config,
        staging=str(staging),
        data_root=str(root),
        catalog=str(cat.path),
        build_key=key,
        inputs=tuple(inputs),
        units=tuple(units),
        dtype=str(dtype.name),
        existing=f"{config.name}@{existing.version}" if existing else None,
        parent=f"{config.name}@{latest}" if latest else None,
    )
    if existing is None:
        staging.mkdir(parents=True, exist_ok=True)
        (staging / "parts").mkdir(exist_ok=True)
        plan_file = staging / "plan.json"
        if plan_file.exists():
            old = json.loads(plan_file.read_text())
            if old.get("build_key") == key and [u for u in old["units"]] == [u.to_dict() for u in units]:
                return BuildPlan.from_dict({**old, "existing": None, "parent": plan.parent})
        atomic_write_text(plan_file, json.dumps(plan.to_dict(), indent=1))
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


def tokenize_unit(staging: str | os.PathLike[str], unit: int) -> UnitResult:
    """Tokenize one work unit into ``parts/``; a unit already done is not redone."""
    staging = Path(staging)
    plan = load_plan(staging)
    cfg = plan.config
    tok_path, docs_path, done_path = _part_paths(staging, unit)
    if done_path.exists():
        return _read_unit_result(done_path)
    wu = plan.units[unit]
    inp = plan.inputs[wu.input]
    tokenizer = load_tokenizer(cfg.tokenizer, backend=cfg.backend)
    dtype = np.dtype(plan.dtype)
    eot = tokenizer.eot_id
    limit = np.iinfo(dtype).max
    counts = dict(rows=0, documents=0, tokens=0, nulls=0, empties=0, invalid_utf8=0, skipped_invalid=0, max_id=0)
    doc_chunks: list[np.ndarray] = []
    tmp_tok = tmp_path_for(tok_path)
    with open(tmp_tok, "wb") as out:
        for batch in iter_text_batches(
            inp, wu, text_column=cfg.text_column, batch_rows=cfg.batch_rows, utf8_errors=cfg.utf8_errors
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
            # The boundary token goes before (BOS) or after (EOS) every document.
            where = offsets[:-1] if cfg.boundary == "bos" else offsets[1:]
            with_boundary = np.insert(tokens.astype(dtype, copy=False), where, dtype.type(eot))
            out.write(with_boundary.data)
            docs = np.empty(len(batch.rows), dtype=_DOC_DTYPE)
            docs["length"] = np.diff(offsets) + 1
            docs["row"] = batch.rows
            docs["score"] = split_scores(inp.relname, batch.rows, cfg.seed)
            doc_chunks.append(docs)
            counts["documents"] += len(docs)
            counts["tokens"] += len(with_boundary)
        out.flush()
        os.fsync(out.fileno())
    counts["max_id"] = max(counts["max_id"], eot) if counts["documents"] else counts["max_id"]
    docs_all = np.concatenate(doc_chunks) if doc_chunks else np.empty(0, dtype=_DOC_DTYPE)
    tmp_docs = tmp_path_for(docs_path)
    with open(tmp_docs, "wb") as f:
        np.save(f, docs_all)
    os.replace(tmp_tok, tok_path)
    os.replace(tmp_docs, docs_path)
    result = UnitResult(unit=unit, **counts)
    atomic_write_text(done_path, json.dumps(result.to_dict()))  # the unit's commit point
    log.info("unit %d of %s: %d documents, %d tokens", unit, inp.relname, result.documents, result.tokens)
    return result


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
    results = [tokenize_unit(staging, u) if not _part_paths(staging, u)[2].exists() else _read_unit_result(_part_paths(staging, u)[2]) for u in range(len(plan.units))]
    total_docs = sum(r.documents for r in results)
    if total_docs == 0:
        nulls = sum(r.nulls for r in results)
        empties = sum(r.empties for r in results)
        raise InputError(
            f"the corpus has no text to tokenize: every one of its {sum(r.rows for r in results)} rows in column "
            f"{cfg.text_column!r} is null ({nulls}) or empty ({empties}); check --text-column"
        )
    cut = _val_selection(plan, staging)
    layout_dir.mkdir(exist_ok=True)
    splits = ("train", "val") if cfg.has_val else ("train",)
    seg_lists: dict[str, list[np.ndarray]] = {s: [] for s in splits}
    totals = {s: {"tokens": 0, "documents": 0} for s in splits}
    starts_tmp = {s: tmp_path_for(layout_dir / f"{s}.starts.i64") for s in splits}
    starts_files = {s: open(starts_tmp[s], "wb") for s in splits}
    try:
        first_index = 0
        for u in range(len(plan.units)):
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
                if cfg.boundary == "eos":
                    pass  # a document starts at its first token either way; EOS closes it
                starts_files[split].write(doc_starts.astype("<i8").tobytes())
                totals[split]["tokens"] += int(split_lengths.sum())
                totals[split]["documents"] += len(idx)
    finally:
        for f in starts_files.values():
            f.close()
    info: dict[str, Any] = {"splits": {}}
    for split in splits:
        segs = np.concatenate(seg_lists[split]) if seg_lists[split] else np.empty(0, dtype=_SEGMENT_DTYPE)
        tmp = tmp_path_for(layout_dir / f"{split}.segments.npy")
        with open(tmp, "wb") as f:
            np.save(f, segs)
        os.replace(tmp, layout_dir / f"{split}.segments.npy")
        os.replace(starts_tmp[split], layout_dir / f"{split}.starts.i64")
        tokens = totals[split]["tokens"]
        nshards = -(-tokens // cfg.shard_tokens)
        info["splits"][split] = {**totals[split], "shards": nshards}
    atomic_write_text(done, json.dumps(info))
    return {k: v["shards"] for k, v in info["splits"].items()}


def _layout_info(staging: Path) -> dict[str, Any]:
    return json.loads((staging / "layout" / "layout.json").read_text())


def _shard_result_path(staging: Path, split: str, k: int) -> Path:
    return staging / "layout" / f"{split}-{k:06d}.shard.json"


def write_shard(staging: str | os.PathLike[str], split: str, k: int) -> dict[str, Any]:
    """Write shard ``k`` of ``split`` and its ``.bos.idx`` into ``out/``; returns its manifest entry."""
    staging = Path(staging)
    done = _shard_result_path(staging, split, k)
    if done.exists():
        return json.loads(done.read_text())
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
    out_dir = staging / "out"
    out_dir.mkdir(exist_ok=True)
    shard_path = out_dir / shard_file_name(cfg.name, split, k, fmt.extension)
    tmp = tmp_path_for(shard_path)
    h = hashlib.sha256()
    header = fmt.header(hi - lo, dtype)
    # Copy through one bounded buffer with plain reads: memory-mapping the parts
    # would count every copied page towards the process's resident memory.
    buf = np.empty(min(_BLOCK_TOKENS, hi - lo), dtype=dtype)
    with open(tmp, "wb") as f:
        f.write(header)
        h.update(header)
        s = int(np.searchsorted(seg_ends, lo, side="right"))
        pos = lo
        while pos < hi:
            unit = int(segs["unit"][s])
            seg_off = pos - int(seg_starts[s])
            take = min(int(segs["length"][s]) - seg_off, hi - pos)
            src_lo = int(segs["start"][s]) + seg_off
            with open(_part_paths(staging, unit)[0], "rb") as part:
                part.seek(src_lo * dtype.itemsize)
                done_tokens = 0
                while done_tokens < take:
                    n = min(len(buf), take - done_tokens)
                    view = memoryview(buf[:n]).cast("B")
                    if part.readinto(view) != len(view):
                        raise ValidationError(f"{part.name}: shorter than the layout says; the staging area is damaged")
                    f.write(view)
                    h.update(view)
                    done_tokens += n
            pos += take
            s += 1
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, shard_path)
    starts = np.memmap(staging / "layout" / f"{split}.starts.i64", dtype="<i8", mode="r")
    a, b = np.searchsorted(starts, [lo, hi], side="left")
    local = np.asarray(starts[a:b], dtype=np.int64) - lo
    idx_path = bosidx.index_path(shard_path)
    idx_bytes = bosidx.encode(local)
    tmp_idx = tmp_path_for(idx_path)
    with open(tmp_idx, "wb") as f:
        f.write(idx_bytes)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp_idx, idx_path)
    entry = ShardEntry(
        file=shard_path.name,
        bytes=len(header) + (hi - lo) * dtype.itemsize,
        sha256=h.hexdigest(),
        tokens=hi - lo,
        documents=len(local),
        index=FileEntry(file=idx_path.name, bytes=len(idx_bytes), sha256=hashlib.sha256(idx_bytes).hexdigest()),
    ).to_dict()
    atomic_write_text(done, json.dumps(entry))
    return entry


def _tools(tokenizer: Tokenizer) -> dict[str, Any]:
    return {
        "shardflow": __version__,
        **tokenizer.library_versions(),
        "numpy": np.__version__,
        "pyarrow": _dist("pyarrow"),
        "python": platform.python_version(),
    }


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
    for split, sinfo in info["splits"].items():
        shards = tuple(
            ShardEntry.from_dict(write_shard(staging, split, k), f"{split} shard {k}") for k in range(sinfo["shards"])
        )
        splits[split] = SplitEntry(documents=sinfo["documents"], tokens=sinfo["tokens"], shards=shards)
    per_input: dict[int, int] = {}
    for r in results:
        per_input[plan.units[r.unit].input] = per_input.get(plan.units[r.unit].input, 0) + r.rows
    totals = {
        "documents": sum(s.documents for s in splits.values()),
        "tokens": sum(s.tokens for s in splits.values()),
        "shards": sum(len(s.shards) for s in splits.values()),
        "bytes": sum(sh.bytes + sh.index.bytes for s in splits.values() for sh in s.shards),
        "input_rows": sum(r.rows for r in results),
        "null_texts": sum(r.nulls for r in results),
        "empty_texts": sum(r.empties for r in results),
        "invalid_utf8": sum(r.invalid_utf8 for r in results),
        "skipped_invalid_utf8": sum(r.skipped_invalid for r in results),
        "max_token_id": max(r.max_id for r in results),
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
        inputs=[{**i.to_dict(), "rows": per_input.get(n, 0)} for n, i in enumerate(plan.inputs)],
        config=cfg.to_dict(),
        tools=_tools(tokenizer),
        build_key=plan.build_key,
        created_at=_now(),
        parent=plan.parent,
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
    validate_dir(out, manifest, checksums=True)
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
            os.replace(out, final)
            fsync_dir(dataset_dir)
        manifest = read_manifest(final)
        cat.add(
            name,
            VersionEntry(
                version=version,
                path=str(final),
                created_at=manifest.created_at,
                build_key=build_key,
                parent=manifest.parent,
                totals={k: manifest.totals[k] for k in ("documents", "tokens", "shards", "bytes")},
            ),
        )
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
    from .embeddings import add_embeddings, embedding_key, validate_embeddings

    cat = Catalog(default_catalog(catalog))
    src_dir = cat.resolve(ref)
    parent = read_manifest(src_dir)
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
    for entry in parent.splits.values():
        for shard in entry.shards:
            for name in (shard.file, shard.index.file):
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


def build(
    config: BuildConfig,
    *,
    data_root: str | os.PathLike[str] | None = None,
    catalog: str | os.PathLike[str] | None = None,
    workers: int = 1,
    on_unit: Callable[[UnitResult], None] | None = None,
) -> BuildResult:
    """Run the whole pipeline in this process, ``workers`` threads wide (no Prefect needed)."""
    if workers < 1:
        raise ConfigError(f"workers must be at least 1, not {workers}")
    plan = plan_build(config, data_root=data_root, catalog=catalog)
    cat = Catalog(plan.catalog)
    if plan.existing:
        return BuildResult(ref=plan.existing, manifest_path=str(cat.resolve(plan.existing) / "metadata.yaml"), created=False)
    with file_lock(Path(plan.staging).parent / f"{plan.build_key[:16]}.lock", timeout=0, what=f"the build of {config.name!r}"):
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for result in pool.map(lambda u: tokenize_unit(plan.staging, u), range(len(plan.units))):
                if on_unit is not None:
                    on_unit(result)
            layout = make_layout(plan.staging)
            jobs = [(s, k) for s, n in layout.items() for k in range(n)]
            list(pool.map(lambda sk: write_shard(plan.staging, *sk), jobs))
        finalize(plan.staging)
        embed_staged(plan.staging)
        ref = publish(plan.staging)
    return BuildResult(ref=ref, manifest_path=str(cat.resolve(ref) / "metadata.yaml"), created=True)
