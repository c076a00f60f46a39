"""The typed hand-offs between the build's stages: what each stage returns and the next one reads.

Every type here is small, frozen and round-trips through the JSON file its
stage commits in the staging directory (``plan.json``, ``parts/unit-N.json``,
``layout/layout.json``, ``layout/SPLIT-K.shard.json``, ``layout/SPLIT-K.embed.json``,
``embed.json``), so a
stage run in another process or after a crash reads exactly what the stage
before it returned.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..config import BuildConfig
from ..manifest import SCHEMA_VERSION, ShardEntry
from ..sources import InputFile, WorkUnit
from .boundaries import Boundaries

__all__ = [
    "SPLITS",
    "STREAMS",
    "BUILD_FORMAT_VERSION",
    "InputCounts",
    "SplitRange",
    "ReusedInput",
    "Reuse",
    "Boundaries",
    "BuildPlan",
    "Piece",
    "UnitResult",
    "SplitLayout",
    "Layout",
    "ShardResult",
    "EmbedFit",
    "EmbedShardResult",
    "EmbedResult",
    "BuildResult",
]

SPLITS = ("train", "val")
# Part of every build key: raise it only when the same inputs and options must give other bytes.
BUILD_FORMAT_VERSION = 2  # 2: shards of whole documents, one or more per work unit (manifest schema 3)


@dataclass(frozen=True, kw_only=True)
class InputCounts:
    """What reading one input found (the manifest's per-input counts)."""

    rows: int = 0
    null_texts: int = 0
    empty_texts: int = 0
    invalid_utf8: int = 0
    skipped_invalid_utf8: int = 0
    max_token_id: int = 0
    bad_records: int = 0
    """Records skipped as unreadable (``on_bad_record="skip"``); in manifests only where it applies."""

    def __add__(self, other: "InputCounts") -> "InputCounts":
        return InputCounts(
            rows=self.rows + other.rows,
            null_texts=self.null_texts + other.null_texts,
            empty_texts=self.empty_texts + other.empty_texts,
            invalid_utf8=self.invalid_utf8 + other.invalid_utf8,
            skipped_invalid_utf8=self.skipped_invalid_utf8 + other.skipped_invalid_utf8,
            max_token_id=max(self.max_token_id, other.max_token_id),
            bad_records=self.bad_records + other.bad_records,
        )

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "InputCounts":
        return cls(**{k: int(d[k] if k != "bad_records" else d.get(k, 0)) for k in cls.__dataclass_fields__})


@dataclass(frozen=True, kw_only=True)
class SplitRange:
    """Where one input's documents are in a split's token stream (contiguous, in corpus order)."""

    first_token: int
    tokens: int
    first_document: int
    documents: int

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SplitRange":
        return cls(**{k: int(d[k]) for k in cls.__dataclass_fields__})


@dataclass(frozen=True, kw_only=True)
class ReusedInput:
    """An input an incremental build takes unchanged from its parent version."""

    relname: str
    counts: InputCounts
    splits: dict[str, SplitRange]
    shards: dict[str, tuple[int, int]]
    """``(first, count)`` of the parent's shards of a placed split that hold this input's documents (schema 3)."""
    entry: dict[str, Any]
    """The parent manifest's entry of this input, as recorded (what ``plan.json`` keeps)."""

    # Fields an input entry must have to be reused (older manifests lack some).
    REQUIRED = frozenset(
        {"relname", "sha256", "size", "rows", "null_texts", "empty_texts", "invalid_utf8", "skipped_invalid_utf8", "max_token_id", "splits"}
    )

    @classmethod
    def from_entry(cls, entry: dict[str, Any]) -> "ReusedInput":
        return cls(
            relname=entry["relname"],
            counts=InputCounts.from_dict(entry),
            splits={s: SplitRange.from_dict(r) for s, r in entry["splits"].items()},
            shards={s: (int(r[0]), int(r[1])) for s, r in entry.get("shards", {}).items()},
            entry=entry,
        )


@dataclass(frozen=True, kw_only=True)
class Reuse:
    """An incremental build: the parent version, and which of our inputs (by index) come from it."""

    parent: str
    """``NAME@VERSION`` of the parent."""
    directory: str
    build_key: str
    """The parent's build key, checked when its files are read (versions are immutable)."""
    inputs: dict[int, ReusedInput]
    split_late: bool = False
    """A reused input is one a full build cuts so that the layout decides its documents' splits (a JSON Lines
    file in several units: ``tokenize.split_decided_late``): so does this build, as a full build would."""

    def signature(self) -> tuple[str, list[int]]:
        """What must match for a resumed run to keep the staged work: the parent and the reused inputs."""
        return self.parent, sorted(self.inputs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "parent": self.parent,
            "directory": self.directory,
            "build_key": self.build_key,
            "inputs": {str(i): r.entry for i, r in sorted(self.inputs.items())},
            **({"split_late": True} if self.split_late else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "Reuse | None":
        if not d:
            return None
        return cls(
            parent=d["parent"],
            directory=d["directory"],
            build_key=d["build_key"],
            inputs={int(i): ReusedInput.from_entry(e) for i, e in d["inputs"].items()},
            split_late=bool(d.get("split_late", False)),
        )


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
    boundaries: Boundaries | None = None
    """The boundary tokens, resolved while planning (None only in a plan read from an older ``plan.json``)."""
    existing: str | None = None
    """``NAME@VERSION`` of an already published identical build; nothing to do then."""
    parent: str | None = None
    """The version this build succeeds, fixed when it is planned: the version whose shards it
    reuses, else the catalog's latest at planning. Recorded in the manifest and the catalog."""
    reuse: Reuse | None = None
    """An incremental build: these inputs get no work units, their tokens come from the parent's shards."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "build_format_version": BUILD_FORMAT_VERSION,
            # The layout of out/ (manifest schema 2: one directory per split): a staging directory
            # left by code writing another layout is started afresh, not resumed.
            "manifest_schema": SCHEMA_VERSION,
            "config": self.config.to_dict(),
            "staging": self.staging,
            "data_root": self.data_root,
            "catalog": self.catalog,
            "build_key": self.build_key,
            "inputs": [i.to_dict() for i in self.inputs],
            "units": [u.to_dict() for u in self.units],
            "dtype": self.dtype,
            "boundaries": None if self.boundaries is None else self.boundaries.to_dict(),
            "existing": self.existing,
            "parent": self.parent,
            "reuse": None if self.reuse is None else self.reuse.to_dict(),
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
            boundaries=Boundaries.from_dict(d["boundaries"]) if d.get("boundaries") else None,
            existing=d.get("existing"),
            parent=d.get("parent"),
            reuse=Reuse.from_dict(d.get("reuse")),
        )

    def unit_label(self, unit: int) -> str:
        """``NAME unit 3/16 part-2.parquet[0:4]``: how progress and the UI name a work unit."""
        u = self.units[unit]
        base = self.inputs[u.input].relname.rsplit("/", 1)[-1]
        return f"{self.config.name} unit {u.index + 1}/{len(self.units)} {base}[{u.start}:{u.stop}]"


STREAMS = ("train", "val", "all")
"""What a tokenize job writes each document to: its split (``train``, ``val``), or ``all`` where the split
is decided over the whole corpus after tokenizing (``val_count``)."""


@dataclass(frozen=True, kw_only=True)
class Piece:
    """One shard file a tokenize job wrote (``parts/unit-N/STREAM-P.EXT``), with its ``.bos.idx`` and sidecars.

    Whole documents, at most ``shard_tokens`` tokens unless one document alone is
    longer; the layout links it into the version as a shard (no copy), or
    gathers several pieces' tokens into one shard (a split that needs gathering).
    """

    tokens: int
    documents: int
    bytes: int
    sha256: str
    index_bytes: int
    index_sha256: str
    sidecars: tuple[tuple[str, int, str], ...] = ()
    """``(suffix, bytes, sha256)`` per sidecar: its file name is the shard's stem plus the suffix."""
    files: tuple[tuple[int, int, int], ...] = ()
    """``(bytes, inode, mtime_ns)`` of the piece, its ``.bos.idx`` and its sidecars as written and checked
    (``UnitShardWriter``): the piece linked as a shard is not read again while they hold. None recorded
    (an older run's record): the shard is read back."""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "sidecars": [list(s) for s in self.sidecars], "files": [list(f) for f in self.files]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Piece":
        return cls(**{**d, "sidecars": tuple((str(a), int(b), str(c)) for a, b, c in d.get("sidecars", ())),
                      "files": tuple((int(a), int(b), int(c)) for a, b, c in d.get("files", ()))})


@dataclass(frozen=True, kw_only=True)
class UnitResult:
    """The counts of one tokenized work unit (``parts/unit-N.json``), and the pieces it wrote per stream."""

    unit: int
    rows: int
    documents: int
    tokens: int
    nulls: int
    empties: int
    invalid_utf8: int
    skipped_invalid: int
    max_id: int
    bad_records: int = 0
    input_sha256: str = ""
    """The SHA-256 of the unit's whole input, when this unit hashed it: an object on object storage,
    planned by its storage identity, is hashed by the worker that reads its first unit."""
    pieces: dict[str, tuple[Piece, ...]] = field(default_factory=dict)
    """Per stream (``STREAMS``) the unit wrote documents to: its pieces, in order."""

    def stream_tokens(self, stream: str) -> int:
        return sum(p.tokens for p in self.pieces.get(stream, ()))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if not self.input_sha256:
            del d["input_sha256"]
        d["pieces"] = {s: [p.to_dict() for p in ps] for s, ps in self.pieces.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "UnitResult":
        pieces = {s: tuple(Piece.from_dict(p) for p in ps) for s, ps in d.get("pieces", {}).items()}
        return cls(**{**d, "pieces": pieces})

    def counts(self) -> InputCounts:
        """The same counts under the manifest's names."""
        return InputCounts(
            rows=self.rows,
            null_texts=self.nulls,
            empty_texts=self.empties,
            invalid_utf8=self.invalid_utf8,
            skipped_invalid_utf8=self.skipped_invalid,
            max_token_id=self.max_id,
            bad_records=self.bad_records,
        )


@dataclass(frozen=True, kw_only=True)
class SplitLayout:
    """One split: its tokens and documents, and where each of its shards comes from.

    A *placed* split (``sources``) has one shard per piece: ``[unit, piece]`` is a
    piece a tokenize job wrote, ``[-1, k]`` shard ``k`` of the parent version's
    split (an unchanged input); each is hard-linked, never copied. A *gathered*
    split (``cuts``) is one token stream (``layout/SPLIT.segments.npy``) cut into
    shards at whole documents: shard ``k`` holds tokens ``[cuts[k], cuts[k+1])``
    (the last up to ``tokens``), copied from the pieces.
    """

    tokens: int
    documents: int
    shards: int
    sources: tuple[tuple[int, int], ...] | None = None
    sizes: tuple[int, ...] = ()
    """Each shard's tokens, in order."""

    @property
    def gathered(self) -> bool:
        return self.sources is None

    def cut(self, k: int) -> tuple[int, int]:
        """Tokens ``[lo, hi)`` of the split's stream that shard ``k`` holds."""
        lo = sum(self.sizes[:k])
        return lo, lo + self.sizes[k]

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"tokens": self.tokens, "documents": self.documents, "shards": self.shards, "sizes": list(self.sizes)}
        if self.sources is not None:
            d["sources"] = [list(src) for src in self.sources]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SplitLayout":
        sources = d.get("sources")
        return cls(
            tokens=int(d["tokens"]),
            documents=int(d["documents"]),
            shards=int(d["shards"]),
            sources=None if sources is None else tuple((int(a), int(b)) for a, b in sources),
            sizes=tuple(int(n) for n in d.get("sizes", ())),
        )


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Which tokens go to which split and shard (``layout/layout.json``; a gathered split's segments hold the rest)."""

    splits: dict[str, SplitLayout]
    inputs: list[dict[str, SplitRange]] = field(default_factory=list)
    """Per input, where its documents are in each split's stream."""
    input_shards: list[dict[str, tuple[int, int]]] = field(default_factory=list)
    """Per input, ``(first, count)`` of the shards of each placed split that hold its documents (and no other's)."""

    def shard_jobs(self) -> list[tuple[str, int]]:
        """``(split, k)`` of every shard to write, in manifest order."""
        return [(split, k) for split, s in self.splits.items() for k in range(s.shards)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "splits": {k: v.to_dict() for k, v in self.splits.items()},
            "inputs": [{s: r.to_dict() for s, r in per.items()} for per in self.inputs],
            "input_shards": [{s: list(r) for s, r in per.items()} for per in self.input_shards],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Layout":
        return cls(
            splits={k: SplitLayout.from_dict(v) for k, v in d["splits"].items()},
            inputs=[{s: SplitRange.from_dict(r) for s, r in per.items()} for per in d["inputs"]],
            input_shards=[{s: (int(r[0]), int(r[1])) for s, r in per.items()} for per in d.get("input_shards", [])],
        )


@dataclass(frozen=True, kw_only=True)
class ShardResult:
    """One written shard: its manifest entry, and whether it was hard-linked from the parent version."""

    split: str
    index: int
    entry: ShardEntry
    linked: bool = False

    @property
    def tokens(self) -> int:
        return self.entry.tokens

    def to_dict(self) -> dict[str, Any]:
        return {**self.entry.to_dict(), "linked": self.linked}

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, split: str, index: int) -> "ShardResult":
        return cls(
            split=split,
            index=index,
            entry=ShardEntry.from_dict({k: v for k, v in d.items() if k != "linked"}, f"{split} shard {index}"),
            linked=bool(d.get("linked", False)),
        )


@dataclass(frozen=True, kw_only=True)
class EmbedFit:
    """The embed-fit stage's output (``layout/embed-pca.json``): the manifest's ``embeddings.pca`` section."""

    pca: dict[str, Any]
    """dim, input_dim, fit_split, sample_rows, explained_variance_ratio, the mean and components files, floors."""


@dataclass(frozen=True, kw_only=True)
class EmbedShardResult:
    """One shard's embeddings (``layout/SPLIT-K.embed.json``): its part of the split's embeddings section."""

    split: str
    index: int
    part: dict[str, Any]
    """The part's manifest entry: file, bytes, sha256, rows, scales, long_documents, truncated, quality."""
    tokens: int = 0
    """Text tokens embedded (after truncation): a measure of the work, not in the manifest."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EmbedShardResult":
        return cls(split=str(d["split"]), index=int(d["index"]), part=d["part"], tokens=int(d.get("tokens", 0)))


@dataclass(frozen=True, kw_only=True)
class EmbedResult:
    """The embedding stage's output: the manifest sections it adds (``embed.json``)."""

    info: dict[str, Any]
    """The manifest's top-level ``embeddings`` section (model, codec, options, floors, PCA)."""
    splits: dict[str, dict[str, Any]]
    """Per split, its ``embeddings`` section (files, sizes, SHA-256, quality)."""
    total_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EmbedResult":
        return cls(info=d["info"], splits=d["splits"], total_bytes=int(d["total_bytes"]))


@dataclass(frozen=True, kw_only=True)
class BuildResult:
    """What a build did: the published reference and where its manifest is."""

    ref: str
    manifest_path: str
    created: bool
    """False when an identical version already existed and nothing was published."""
