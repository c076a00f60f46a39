"""Validation: check a version's files against its manifest and its format, byte for byte.

The same checks run after every build (before anything is published) and on
any published version (``shardflow validate REF``):

* every file named by the manifest exists, inside the version directory, with
  the manifest's size and (with ``checksums=True``) its SHA-256;
* each shard's header agrees with its size, its dtype and its token count;
* every token id is below the vocabulary size;
* the files a format keeps beside a shard (``megatron``'s ``.idx``) are the
  manifest's, and agree with the shard's document starts
  (``ShardFormat.check_sidecars``);
* ``.bos.idx`` entries are ascending, in range, one per document, and point at
  document starts: at BOS tokens with BOS placement (and every BOS is indexed),
  right after EOS tokens with EOS placement (and every EOS is followed by one),
  at BOS tokens preceded by the EOS (inside the shard) with both;
* per-split and overall totals add up;
* the embeddings, if any (``shardflow.embed.files.validate_embeddings``);
* the statistics, if any: ``stats.json`` and ``stats.vocab.npy`` of the manifest's
  size and SHA-256, their counts those of the splits (``shardflow.stats.stats_problems``).

Shards are scanned in bounded blocks, so memory does not grow with shard size.
One shard's checks (``validate_shard_entry``) need its manifest entry and a
``ShardContext`` (the version's facts), not the whole manifest. A schema-3 shard
holds whole documents and is checked from its own files; only schemas 1 and 2
read a neighbour's edge token. The checks of the tokens against the index are
``shard_checks.ShardScan``'s, which a build runs on the arrays as it writes each
shard (``pipeline/check.py``), so that a build reads no shard back: this is the
full re-read, for ``shardflow validate`` and whoever wants it.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ._io import BackgroundSha256, sha256_file
from .provenance import published_manifest_problems
from .errors import ManifestError, ValidationError
from .faults import fault
from .formats import ShardFormat, bosidx, get_format
from .manifest_files import refuse_repeated_shards
from .manifest import Manifest, ShardEntry, read_manifest, version_file
from .shard_checks import ShardContext, ShardScan
from .shardset import ShardSet
from .stats import stats_problems

# published_manifest_problems is the catalog's check (shardflow.catalog); it is
# re-exported here, where it has always been importable from.
__all__ = [
    "ShardContext",
    "ValidationReport",
    "validate_dir",
    "validate_shard",
    "validate_shard_entry",
    "published_manifest_problems",
]

_BLOCK = 8 << 20  # tokens per scan block (two buffers of it: 64 MiB of uint32, as one of 16 Mi before)


@dataclass
class ValidationReport:
    """What was checked, and every problem found (empty when valid)."""

    directory: str
    shards: int = 0
    tokens: int = 0
    documents: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


_recent_sets: dict[tuple[int, str, str], tuple[Manifest, ShardSet]] = {}


def _shard_set(directory: Path, manifest: Manifest, split: str) -> ShardSet:
    # validate_dir asks once per shard: building the set (O(shards)) on every
    # call would make EOS validation quadratic. Keyed by the manifest object
    # (kept here, so its id is not reused), since a changed manifest is a new one.
    key = (id(manifest), str(directory), split)
    hit = _recent_sets.get(key)
    if hit is not None and hit[0] is manifest:
        return hit[1]
    shards = ShardSet.from_manifest(directory, manifest, split)
    if len(_recent_sets) >= 4:
        _recent_sets.clear()
    _recent_sets[key] = (manifest, shards)
    return shards


def _next_first(shards: ShardSet, k: int) -> int | None:
    """The first token after shard ``k`` in its split (None at the split's end)."""
    for j in range(k + 1, shards.num_shards):
        if shards.shards[j].tokens:
            return shards.first_token(j)
    return None


def validate_shard(
    directory: Path, manifest: Manifest, split: str, k: int, entry: ShardEntry, *, checksums: bool = True
) -> list[str]:
    """Problems with one shard and its index (empty list when both are right); the neighbours from ``manifest``."""
    directory = Path(directory)
    # The split's set is built (and cached) only when a check asks for a neighbour's token.
    ctx = ShardContext.of_manifest(
        manifest,
        previous_last=lambda: _shard_set(directory, manifest, split).last_token(k - 1),
        next_first=lambda: _next_first(_shard_set(directory, manifest, split), k),
    )
    return validate_shard_entry(directory, ctx, split, k, entry, checksums=checksums)


def validate_shard_entry(
    directory: Path, ctx: ShardContext, split: str, k: int, entry: ShardEntry, *, checksums: bool = True
) -> list[str]:
    """Problems with shard ``k`` of ``split`` and its index (empty list when both are right).

    Reads the shard's own files; for a version of schema 1 or 2 (``ctx.whole_documents`` false), also at most
    one page of a neighbouring shard (``ctx``'s lookups).
    """
    try:  # the one confinement check (relative, inside the version, no symlink out of it)
        path = version_file(directory, entry.file, f"shard {k} of split {split!r}")
        idx_path = version_file(directory, entry.index.file, f"the index of shard {k} of split {split!r}")
    except ManifestError as exc:
        return [str(exc)]
    fault("validate", path)
    problems: list[str] = []
    fmt = get_format(ctx.format_name)
    dtype = np.dtype(ctx.dtype).newbyteorder("<")
    if not path.exists():
        return [f"{path}: shard {k} of split {split!r} is missing"]
    size = path.stat().st_size
    if size != entry.bytes:
        problems.append(f"{path}: {size} bytes, but the manifest says {entry.bytes}; the shard is truncated or was changed")
    try:
        tokens = fmt.open(path, dtype)  # checks header and size; reads no token pages
    except ValidationError as exc:
        return problems + [str(exc)]
    if len(tokens) != entry.tokens:
        problems.append(f"{path}: the header says {len(tokens)} tokens, the manifest says {entry.tokens}")
    if not idx_path.exists():
        return problems + [f"{idx_path}: the .bos.idx index of {entry.file} is missing"]
    if idx_path.stat().st_size != entry.index.bytes:
        problems.append(f"{idx_path}: {idx_path.stat().st_size} bytes, but the manifest says {entry.index.bytes}")
    elif checksums and _sha256(idx_path) != entry.index.sha256:
        problems.append(f"{idx_path}: SHA-256 does not match the manifest; the index was changed")
    try:
        starts = bosidx.read(idx_path, len(tokens))
    except ValidationError as exc:
        return problems + [str(exc)]
    if len(starts) != entry.documents:
        problems.append(f"{idx_path}: {len(starts)} entries, but the manifest says {entry.documents} documents start in {entry.file}")
    problems.extend(_sidecar_problems(directory, fmt, path, entry, len(tokens), dtype, starts, checksums=checksums))
    n = len(tokens)
    header_bytes = path.stat().st_size - n * dtype.itemsize
    # One pass of plain reads through two bounded buffers (a memory map would grow resident
    # memory): the token checks of one block (``ShardScan``, the build's checks at write time)
    # while the hash of the same block runs on another core (BackgroundSha256; the buffers alternate).
    scan = ShardScan(ctx, path, idx_path, k)
    h = BackgroundSha256()
    size = min(_BLOCK, max(n, 1))
    buffers = (np.empty(size, dtype=dtype), np.empty(size, dtype=dtype))
    with open(path, "rb") as f:
        head = f.read(max(header_bytes, 0))
        h.update(head)
        lo = 0
        while lo < n:
            buf = buffers[(lo // size) % 2]  # its block of two steps ago is hashed: update() waited for it
            count = min(len(buf), n - lo)
            view = memoryview(buf[:count]).cast("B")
            if f.readinto(view) != len(view):
                return problems + [f"{path}: ended early while reading token {lo}"]
            h.update(view)
            try:
                scan.feed(buf[:count])
            except ValidationError as exc:  # an id past the vocabulary: the rest is not read
                return problems + [str(exc)]
            lo += count
    if checksums and h.hexdigest() != entry.sha256:
        problems.append(
            f"{path}: SHA-256 {h.hexdigest()[:16]}... does not match the manifest's {entry.sha256[:16]}...; "
            "the shard's bytes were changed"
        )
    return problems + scan.problems(starts)


def _sidecar_problems(
    directory: Path,
    fmt: ShardFormat,
    path: Path,
    entry: ShardEntry,
    ntokens: int,
    dtype: np.dtype,
    starts: np.ndarray,
    *,
    checksums: bool,
) -> list[str]:
    """The format's files beside a shard (megatron's ``.idx``): listed, sized and hashed as the manifest says,
    and what the format's own ``check_sidecars`` finds in them."""
    problems: list[str] = []
    expected = [p.relative_to(directory).as_posix() for p in fmt.sidecars(path, ntokens, dtype, starts)]
    listed = [f.file for f in entry.sidecars]
    for name in expected:
        if name not in listed:
            problems.append(f"{directory / name}: format {fmt.name!r} keeps it beside {entry.file}, but the manifest does not list it")
    for f in entry.sidecars:
        try:
            p = version_file(directory, f.file, f"a file beside {entry.file}")
        except ManifestError as exc:
            problems.append(str(exc))
            continue
        if f.file not in expected:
            problems.append(f"{p}: the manifest lists it beside {entry.file}, but format {fmt.name!r} has no such file")
        elif not p.exists():
            problems.append(f"{p}: missing; the manifest lists it beside {entry.file}")
        elif p.stat().st_size != f.bytes:
            problems.append(f"{p}: {p.stat().st_size} bytes, but the manifest says {f.bytes}")
        elif checksums and _sha256(p) != f.sha256:
            problems.append(f"{p}: SHA-256 does not match the manifest; the file was changed")
    return problems + fmt.check_sidecars(path, ntokens, dtype, starts)


def _rank_file_problems(directory: Path, manifest: Manifest) -> list[str]:
    """The copy of the tokenizer file that a version carries: present, and the file the build used.

    A local rank file (``rank_file``), or a tokenizer.json / ``.model`` (``tokenizer_file``).
    """
    info = manifest.tokenized_info
    kind, key, named = ("rank file", "rank_file", "the tokenizer's rank file")
    if not info.get(key):
        kind, key, named = ("tokenizer file", "tokenizer_file", "the tokenizer file")
    name = info.get(key)
    if not name:
        return []
    try:  # an absolute or '../' name would hash (and the reader load) a file outside the version
        path = version_file(directory, name, f"tokenized_info.{key}")
    except ManifestError as exc:
        return [str(exc)]
    if not path.is_file():
        return [f"{path}: missing; the manifest names it as {named}"]
    if sha256_file(path) != info.get(f"{key}_sha256"):
        return [f"{path}: the {kind} does not match its SHA-256 in the manifest; it is not the one the build used"]
    return []


def validate_dir(
    directory: Path | str,
    manifest: Manifest | None = None,
    *,
    checksums: bool = True,
    published: bool = False,
    catalog: Any = None,
    shards: bool = True,
    standalone: bool = False,
    workers: int | None = None,
    progress: Callable[[int, int], Callable[[int], None]] | None = None,
) -> ValidationReport:
    """Validate a version directory; raises ``ValidationError`` listing every problem.

    ``shards=False`` leaves out the per-shard checks (``validate_shard``), for a
    build whose shards were each checked as they were written (``pipeline/check.py``). ``workers`` shards
    are checked at once (default: up to 4, the cores'); ``progress(shards, bytes)``, given, is called once with
    the totals and returns what is told of each shard's bytes as it is checked.

    ``published=True`` also checks the manifest against the SHA-256 that the
    catalog (``catalog``, default ``$SHARDFLOW_CATALOG`` or ``./manifests``)
    recorded when the version was published: the catalog that lists the directory, that
    one or the one its publisher record names (``provenance.vouch_for``). A directory no
    catalog lists is a problem then, unless ``standalone`` (its files are then checked
    against its own manifest only).
    """
    directory = Path(directory)
    manifest = manifest or read_manifest(directory)
    refuse_repeated_shards(directory, manifest)
    report = ValidationReport(directory=str(directory))
    if published:
        report.problems.extend(published_manifest_problems(directory, manifest, catalog, standalone=standalone))
    jobs = [(split, k, shard) for split, entry in manifest.splits.items() for k, shard in enumerate(entry.shards)] if shards else []
    # hashlib and numpy release the GIL on large buffers, so threads use every core (``workers`` shards at once).
    done = progress(len(jobs), sum(shard.bytes for _, _, shard in jobs)) if progress is not None else None
    with ThreadPoolExecutor(max_workers=max(1, workers or min(4, os.cpu_count() or 1))) as pool:
        found = pool.map(lambda job: validate_shard(directory, manifest, *job, checksums=checksums), jobs)
        for (_, _, shard), problems in zip(jobs, found):
            report.problems.extend(problems)
            if done is not None:
                done(shard.bytes)
    for split, entry in manifest.splits.items():
        tokens = documents = 0
        for shard in entry.shards:
            tokens += shard.tokens
            documents += shard.documents
        if tokens != entry.tokens:
            report.problems.append(f"{directory}: split {split!r} shards hold {tokens} tokens, the manifest says {entry.tokens}")
        if documents != entry.documents:
            report.problems.append(
                f"{directory}: split {split!r} indexes list {documents} documents, the manifest says {entry.documents}"
            )
        report.shards += len(entry.shards)
        report.tokens += tokens
        report.documents += documents
    report.problems.extend(_rank_file_problems(directory, manifest))
    if manifest.extra.get("embeddings"):
        # Imported here: the embedding codecs need ml_dtypes, which the runtime-only install
        # (numpy and PyYAML) lacks, and a version without embeddings validates there too.
        from .embed.files import validate_embeddings

        report.problems.extend(validate_embeddings(directory, manifest, checksums=checksums))
    report.problems.extend(stats_problems(directory, manifest, checksums=checksums))
    totals: dict[str, Any] = manifest.totals
    if totals.get("tokens") != report.tokens or totals.get("documents") != report.documents:
        report.problems.append(
            f"{directory}: totals say {totals.get('tokens')} tokens / {totals.get('documents')} documents, "
            f"the splits add up to {report.tokens} / {report.documents}"
        )
    if report.problems:
        head = f"validation of {directory} failed ({len(report.problems)} problem{'s' if len(report.problems) > 1 else ''}):"
        raise ValidationError("\n  ".join([head, *report.problems]))
    return report
