"""Sources: find the input files, cut them into work units, and read texts in bounded batches.

Inputs are Parquet files, Arrow IPC files or streams (``.arrow``, ``.feather``,
``.ipc``), directories or globs of those, and Hugging Face ``datasets`` saved
with ``save_to_disk`` (a directory with ``state.json``; its Arrow files are
read directly, in the dataset's order). A work unit is a run of whole row
groups (or record batches) of one file, about ``unit_bytes`` of text; units
are read with ``iter_batches`` in batches of about ``batch_bytes`` of text, so memory depends
on the batch size and never on the corpus size.

Null and empty texts are skipped and counted; invalid UTF-8 in a binary text
column is replaced or skipped (``utf8_errors``) and counted.
"""

from __future__ import annotations

import dataclasses
import glob as globmod
import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ._io import atomic_write_text, sha256_file
from .errors import InputError

__all__ = [
    "InputFile",
    "WorkUnit",
    "TextBatch",
    "discover_inputs",
    "plan_units",
    "iter_text_batches",
    "fingerprint_inputs",
]

PARQUET_SUFFIXES = (".parquet", ".pq")
ARROW_SUFFIXES = (".arrow", ".feather", ".ipc")
ArrowKind = Literal["parquet", "arrow-file", "arrow-stream"]
_ARROW_FILE_MAGIC = b"ARROW1"


@dataclass(frozen=True, kw_only=True)
class InputFile:
    """One input file. ``relname`` is stable across machines and is what the manifest records."""

    path: str
    relname: str
    kind: ArrowKind
    size: int
    sha256: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class WorkUnit:
    """Row groups (Parquet) or record batches (Arrow) ``[start, stop)`` of one input."""

    index: int
    input: int
    start: int
    stop: int
    first_row: int
    rows: int
    text_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class TextBatch:
    """Texts to tokenize (no nulls, no empties) and their row numbers in the input file."""

    texts: pa.Array
    rows: np.ndarray
    nulls: int
    empties: int
    invalid_utf8: int
    skipped_invalid: int


def _is_glob(spec: str) -> bool:
    return any(ch in spec for ch in "*?[")


def _kind_of(path: Path) -> ArrowKind:
    suffix = path.suffix.lower()
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    if suffix in ARROW_SUFFIXES:
        with open(path, "rb") as f:
            return "arrow-file" if f.read(6) == _ARROW_FILE_MAGIC else "arrow-stream"
    raise InputError(
        f"{path}: unsupported file type {suffix or '(none)'!r}; inputs are Parquet "
        f"({', '.join(PARQUET_SUFFIXES)}) or Arrow ({', '.join(ARROW_SUFFIXES)}) files"
    )


def _input(path: Path, relname: str, kind: ArrowKind | None = None) -> InputFile:
    size = path.stat().st_size
    if size == 0:
        raise InputError(f"{path}: the file is empty (0 bytes); remove it or regenerate it")
    return InputFile(path=str(path.resolve()), relname=relname, kind=kind or _kind_of(path), size=size)


def _hf_dataset_inputs(root: Path) -> list[InputFile]:
    """The Arrow files of a ``datasets`` ``save_to_disk`` directory, in dataset order."""
    state = json.loads((root / "state.json").read_text())
    files = [entry["filename"] for entry in state.get("_data_files", [])]
    if not files:
        raise InputError(f"{root}: state.json lists no data files; is this a complete save_to_disk directory?")
    return [_input(root / name, name, "arrow-stream") for name in files]


def discover_inputs(specs: tuple[str, ...] | list[str]) -> list[InputFile]:
    """Expand files, directories, globs and saved datasets into an ordered list of inputs."""
    found: list[InputFile] = []
    labels: list[str] = []  # per input: the name of the directory its relname is relative to
    for spec in specs:
        before = len(found)
        if _is_glob(spec):
            matches = sorted(globmod.glob(spec, recursive=True))
            matches = [m for m in matches if Path(m).is_file()]
            if not matches:
                raise InputError(f"{spec}: the pattern matches no files; check the path and the pattern")
            base = Path(spec.split("*")[0].split("?")[0].split("[")[0])
            base = base if spec.endswith(os.sep) or base.is_dir() else base.parent
            found.extend(_input(Path(m), os.path.relpath(m, base)) for m in matches)
            labels.extend([Path(os.path.abspath(base)).name] * (len(found) - before))
            continue
        path = Path(spec).expanduser()
        if not path.exists():
            raise InputError(f"{spec}: no such file or directory; check the path")
        if path.is_dir():
            if (path / "dataset_dict.json").exists():
                splits = sorted(p.name for p in path.iterdir() if p.is_dir())
                raise InputError(
                    f"{spec}: this is a DatasetDict with splits {', '.join(splits)}; pass one split's directory, "
                    f"e.g. {path / (splits[0] if splits else 'train')}"
                )
            if (path / "state.json").exists():
                found.extend(_hf_dataset_inputs(path))
                labels.extend([path.resolve().name] * (len(found) - before))
                continue
            files = sorted(
                p
                for p in path.rglob("*")
                if p.is_file() and p.suffix.lower() in PARQUET_SUFFIXES + ARROW_SUFFIXES and not p.name.startswith(".")
            )
            if not files:
                raise InputError(
                    f"{spec}: the directory has no Parquet or Arrow files "
                    f"({', '.join(PARQUET_SUFFIXES + ARROW_SUFFIXES)})"
                )
            found.extend(_input(p, p.relative_to(path).as_posix()) for p in files)
        else:
            found.append(_input(path, path.name))
        labels.extend([path.resolve().parent.name if path.is_file() else path.resolve().name] * (len(found) - before))
    return _distinct_relnames(found, labels)


def _distinct_relnames(found: list[InputFile], labels: list[str]) -> list[InputFile]:
    """Refuse a file given twice; qualify clashing names (``a/part-0.parquet``, ``b/part-0.parquet``).

    When no two names clash, every name stays as it is, so the manifest, the held-out
    split and incremental reuse of existing datasets do not change.
    """
    by_path: dict[str, str] = {}
    for inp in found:
        if inp.path in by_path:
            raise InputError(f"{inp.path}: the file is given twice (through two of the sources); give it once")
        by_path[inp.path] = inp.relname
    names = [inp.relname for inp in found]
    if len(set(names)) == len(names):
        return found
    qualified = [f"{label}/{inp.relname}" for inp, label in zip(found, labels)]
    seen: dict[str, str] = {}
    for inp, name in zip(found, qualified):
        if name in seen:
            raise InputError(
                f"{seen[name]} and {inp.path} both get the input name {name!r}; rename one of them or its "
                "directory, so that every input has a distinct name"
            )
        seen[name] = inp.path
    return [dataclasses.replace(inp, relname=name) for inp, name in zip(found, qualified)]


def _fingerprint_cache_path(cache_dir: Path | None) -> Path | None:
    return None if cache_dir is None else cache_dir / ".fingerprints.json"


def fingerprint_inputs(inputs: list[InputFile], cache_dir: Path | None = None) -> list[InputFile]:
    """Attach each input's SHA-256 (its content fingerprint), reusing a stat-keyed cache.

    Hashing reads every byte once; the cache (keyed by path, size, mtime and
    inode, like git's index) makes a rebuild over unchanged files cheap.
    """
    from concurrent.futures import ThreadPoolExecutor

    cache_file = _fingerprint_cache_path(cache_dir)
    cache: dict[str, Any] = {}
    if cache_file is not None and cache_file.exists():
        try:
            cache = json.loads(cache_file.read_text())
        except (OSError, ValueError):
            cache = {}

    def stat_key(inp: InputFile) -> str:
        st = os.stat(inp.path)
        # ctime too: a rewrite that keeps size and mtime (cp -p, rsync -t, os.utime) still changes it.
        return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"

    def digest(inp: InputFile) -> str:
        key = stat_key(inp)
        hit = cache.get(inp.path)
        if hit and hit.get("stat") == key:
            return str(hit["sha256"])
        return sha256_file(Path(inp.path))

    # hashlib releases the GIL on large buffers, so threads hash files in parallel.
    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        digests = list(pool.map(digest, inputs))
    out = [InputFile(**{**inp.to_dict(), "sha256": d}) for inp, d in zip(inputs, digests)]
    if cache_file is not None:
        for inp in out:
            cache[inp.path] = {"stat": stat_key(inp), "sha256": inp.sha256}
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(cache_file, json.dumps(cache, indent=0, sort_keys=True))
        except OSError:
            pass  # the cache is an optimisation only
    return out


def _check_schema(inp: InputFile, schema: pa.Schema, text_column: str, id_column: str | None) -> None:
    names = schema.names
    if text_column not in names:
        raise InputError(
            f"{inp.path}: no column {text_column!r}; the columns are {', '.join(names)}. "
            "Pick the text column with --text-column NAME"
        )
    ty = schema.field(text_column).type
    if not _is_text_type(ty):
        raise InputError(
            f"{inp.path}: column {text_column!r} has type {ty}, not a string type; "
            "pick a string column with --text-column NAME"
        )
    if id_column is not None and id_column not in names:
        raise InputError(f"{inp.path}: no id column {id_column!r}; the columns are {', '.join(names)}")


def _open_parquet(inp: InputFile) -> pq.ParquetFile:
    try:
        # A buffered stream reads column pages incrementally, so a huge row group
        # never has to be in memory at once (the memory bound is the batch size).
        return pq.ParquetFile(inp.path, buffer_size=1 << 20, pre_buffer=False)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        raise InputError(f"{inp.path}: not a readable Parquet file ({exc}); the file is corrupt or truncated") from None


def _open_arrow(inp: InputFile) -> Any:
    try:
        source = pa.memory_map(inp.path, "r")
        if inp.kind == "arrow-file":
            return pa.ipc.open_file(source)
        return pa.ipc.open_stream(source)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        raise InputError(f"{inp.path}: not a readable Arrow IPC file ({exc}); the file is corrupt or truncated") from None


def _arrow_batches(inp: InputFile) -> list[pa.RecordBatch]:
    reader = _open_arrow(inp)
    try:
        if inp.kind == "arrow-file":
            return [reader.get_batch(i) for i in range(reader.num_record_batches)]
        return list(reader)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        raise InputError(f"{inp.path}: reading failed ({exc}); the file is corrupt or truncated") from None


def plan_units(
    inputs: list[InputFile], *, text_column: str, id_column: str | None, unit_bytes: int
) -> list[WorkUnit]:
    """Cut every input into work units of whole row groups / record batches, about ``unit_bytes`` each."""
    units: list[WorkUnit] = []
    for i, inp in enumerate(inputs):
        sizes: list[tuple[int, int]]  # (rows, text bytes) per row group / batch
        if inp.kind == "parquet":
            pf = _open_parquet(inp)
            _check_schema(inp, pf.schema_arrow, text_column, id_column)
            col = pf.schema_arrow.get_field_index(text_column)
            md = pf.metadata
            sizes = []
            for g in range(md.num_row_groups):
                rg = md.row_group(g)
                # Leaf index equals field index for flat schemas, which text corpora are.
                nbytes = rg.column(col).total_uncompressed_size if col < rg.num_columns else rg.total_byte_size
                sizes.append((rg.num_rows, nbytes))
        else:
            batches = _arrow_batches(inp)
            schema = batches[0].schema if batches else _open_arrow(inp).schema
            _check_schema(inp, schema, text_column, id_column)
            sizes = [(b.num_rows, b.column(text_column).nbytes) for b in batches]
        row = 0
        start = 0
        while start < len(sizes):
            stop, rows, nbytes = start, 0, 0
            while stop < len(sizes) and (stop == start or nbytes + sizes[stop][1] <= unit_bytes):
                rows += sizes[stop][0]
                nbytes += sizes[stop][1]
                stop += 1
            units.append(
                WorkUnit(index=len(units), input=i, start=start, stop=stop, first_row=row, rows=rows, text_bytes=nbytes)
            )
            row += rows
            start = stop
    return units


def _is_text_type(ty: pa.DataType) -> bool:
    """String or binary, plain, large, view (polars writes Arrow IPC with views) or dictionary-encoded."""
    if pa.types.is_dictionary(ty):
        ty = ty.value_type
    return (
        pa.types.is_string(ty)
        or pa.types.is_large_string(ty)
        or pa.types.is_binary(ty)
        or pa.types.is_large_binary(ty)
        or str(ty) in ("string_view", "binary_view")
    )


def _clean(col: pa.Array, inp: InputFile, first_row: int, utf8_errors: str) -> TextBatch:
    """Drop nulls and empties, decode binary text; keep the row number of every kept text."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    if str(col.type) in ("string_view", "binary_view"):  # tokenizers read offsets + data buffers
        col = col.cast(pa.large_string() if str(col.type) == "string_view" else pa.large_binary())
    n = len(col)
    invalid = skipped = 0
    if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
        target = pa.large_string() if pa.types.is_large_binary(col.type) else pa.string()
        try:
            col = col.cast(target)  # validates UTF-8; the common case costs one pass
        except pa.ArrowInvalid:
            values: list[str | None] = []
            for j, raw in enumerate(col.to_pylist()):
                if raw is None:
                    values.append(None)
                    continue
                try:
                    values.append(raw.decode("utf-8"))
                except UnicodeDecodeError:
                    invalid += 1
                    if utf8_errors == "skip":
                        skipped += 1
                        values.append(None)
                    else:
                        values.append(raw.decode("utf-8", errors="replace"))
            col = pa.array(values, type=target)
    nulls = col.null_count - skipped
    lengths = pc.binary_length(col)
    keep = pc.and_(pc.is_valid(col), pc.greater(pc.fill_null(lengths, 0), 0))
    keep_np = keep.to_numpy(zero_copy_only=False)
    kept = int(keep_np.sum())
    empties = n - nulls - skipped - kept
    rows = np.flatnonzero(keep_np).astype(np.int64) + first_row
    texts = col if kept == n else col.filter(keep)
    return TextBatch(texts=texts, rows=rows, nulls=nulls, empties=empties, invalid_utf8=invalid, skipped_invalid=skipped)


def iter_text_batches(
    inp: InputFile, unit: WorkUnit, *, text_column: str, batch_rows: int, utf8_errors: str = "replace"
) -> Iterator[TextBatch]:
    """The unit's texts in batches of at most ``batch_rows`` rows, in file order."""
    row = unit.first_row
    try:
        if inp.kind == "parquet":
            pf = _open_parquet(inp)
            batches: Any = pf.iter_batches(
                batch_size=batch_rows, row_groups=list(range(unit.start, unit.stop)), columns=[text_column]
            )
        else:
            batches = (
                b.column(text_column).slice(k, batch_rows)
                for b in _arrow_batches(inp)[unit.start : unit.stop]
                for k in range(0, b.num_rows, batch_rows)
            )
        for batch in batches:
            col = batch.column(text_column) if isinstance(batch, pa.RecordBatch) else batch
            yield _clean(col, inp, row, utf8_errors)
            row += len(col)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno is not None:
            raise  # an I/O error of the disk or mount (EIO, ...), not bad data: the caller may retry
        where = (_damaged_row_group(inp, unit, text_column) if inp.kind == "parquet" else None) or f"near row {row}"
        detail = " ".join(str(exc).split())
        raise InputError(
            f"{inp.path}: reading failed {where} ({detail}); the file is corrupt or truncated: "
            "replace it, or remove it from the sources"
        ) from None


def _damaged_row_group(inp: InputFile, unit: WorkUnit, text_column: str) -> str | None:
    """Which row group of a unit cannot be read, as ``"in row group G (rows A to B)"``."""
    try:
        pf = pq.ParquetFile(inp.path)
        first = unit.first_row
        for g in range(unit.start, unit.stop):
            n = pf.metadata.row_group(g).num_rows
            try:
                pf.read_row_group(g, columns=[text_column])
            except (pa.ArrowInvalid, pa.ArrowIOError, OSError):
                return f"in row group {g} (rows {first} to {first + n - 1})"
            first += n
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError):
        return None
    return None


def split_scores(relname: str, rows: np.ndarray, seed: int) -> np.ndarray:
    """A uint64 pseudo-random score per document, from (seed, input name, row).

    It depends on nothing else (not the worker count, not the other inputs), so
    the held-out split is the same however the build is cut up, and an
    incremental build reuses the same choices for unchanged files.
    """
    h = hashlib.blake2b(f"{seed}\0{relname}".encode(), digest_size=8).digest()
    base = np.uint64(int.from_bytes(h, "little"))
    # splitmix64 over (base + row): a good 64-bit mix, vectorized; wraps mod 2**64.
    with np.errstate(over="ignore"):
        z = rows.astype(np.uint64) + base
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return z
