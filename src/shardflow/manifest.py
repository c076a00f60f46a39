"""The manifest: ``metadata.yaml`` in every version directory, read through a typed schema.

The manifest is a superset of tatm's metadata (name, description, dataset_path,
data_content, content_field, tokenized_info, parent_datasets) plus everything a
reader needs to trust the data: the format and its header magic, the document
boundary token and its placement, per split the ordered shards with sizes,
token and document counts and SHA-256 of every file, the totals, the inputs with
their content fingerprints, the whole build configuration, tool versions,
creation time and the parent version.

It is written last, as the commit point of a version, and read only with a
bounded safe loader (``_yaml``: size limits, no alias bombs). Every field is
type-checked against the schema, and a bad one is refused with one message
naming the file and the field. A schema version this code does not know is
refused by name.

Schema 3 (this code writes it) keeps each split's shards in their own
directory (``train/``, ``val/``), of whole documents, and the embeddings in
``embeddings/``, so the manifest's file names are ``SPLIT/FILE``; a version of
more than ``SHARD_TABLE_ABOVE`` shards is written as schema 4, schema 3 with
its shards listed in a shard table beside the manifest (``shardflow.shard_table``).
Schema 1 and 2 versions (every file flat in the version directory; shards cut
across documents) are still read, validated and reused as parents.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NamedTuple

import yaml

from ._io import atomic_write_text
from ._yaml import YamlRefused, YamlRepeated, describe_yaml_error, load_yaml_file
from .errors import ManifestError
from .shard_table import TABLE_SCHEMA_VERSION, read_table, tabled_yaml
from .version_paths import check_relative_file, joined_file, shown as _shown, version_file

__all__ = [
    "SCHEMA_VERSION",
    "SHARD_TABLE_ABOVE",
    "TABLE_SCHEMA_VERSION",
    "READABLE_SCHEMA_VERSIONS",
    "MANIFEST_NAME",
    "EMBEDDINGS_DIR",
    "FileEntry",
    "ShardEntry",
    "SplitEntry",
    "Manifest",
    "BoundaryTokens",
    "boundary_tokens",
    "read_manifest",
    "write_manifest",
    "shard_table_wanted",
    "version_file",
    "joined_file",
]

SCHEMA_VERSION = 3
"""The schema of the versions this code builds (one directory per split, shards of whole documents); a manifest
is written as schema 4 (``TABLE_SCHEMA_VERSION``: 3, its shards in ``shards.tsv``) exactly when it has a table."""
SHARD_TABLE_ABOVE = 500
"""Builds list the shards of a version of more than this many (all splits) in a shard table: ``read_manifest`` of
YAML took 0.07-0.08 s at 500 shards, 0.15-0.21 s at 1,000, about 5 s at 35,000; with a table 0.01 s at 500
(median of 7, warm). Smaller versions keep their one-file manifest, byte for byte as before."""
READABLE_SCHEMA_VERSIONS = (1, 2, 3, 4)
"""1: every file flat in the version directory; 2: one directory per split, ``embeddings/``; 3: shards of whole documents,
of any size up to ``shard_tokens``, each input's own shards listed in its entry; 4: 3, the shards in ``shard_table``."""
MANIFEST_NAME = "metadata.yaml"
MAX_MANIFEST_BYTES = 256 << 20
"""The largest ``metadata.yaml`` read (one of 100,000 shards is about 40 MB)."""
UNIQUE_FILES = (("splits", "*", "shards", "*", "file"),)
"""Where a manifest names its shard files: each at most once, refused at its second listing while parsing."""
TOKEN_DTYPES = ("uint16", "uint32")
EMBEDDINGS_DIR = "embeddings"
"""The directory of a schema-2 version holding its embedding files, apart from every split's shards."""


def _require(d: dict[str, Any], key: str, where: str) -> Any:
    if key not in d:
        raise ManifestError(f"{where}: missing field {key!r}")
    return d[key]


def _kind(value: Any, what: str, key: str, where: str) -> ManifestError:
    return ManifestError(f"{where}: field {key!r} must be {what}, not {_shown(value)}; restore the file or rebuild the version")


def _int(d: dict[str, Any], key: str, where: str) -> int:
    """A required non-negative integer field (``bytes: "lots"`` and ``True`` are refused)."""
    value = _require(d, key, where)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _kind(value, "a non-negative integer", key, where)
    return value


def _str(d: dict[str, Any], key: str, where: str, *, optional: bool = False) -> Any:
    """A required string field (``None`` too with ``optional``); no NUL characters."""
    value = d.get(key) if optional else _require(d, key, where)
    if optional and value is None:
        return None
    if not isinstance(value, str) or "\0" in value:
        raise _kind(value, "a string" + (" or null" if optional else ""), key, where)
    return value


def _mapping(value: Any, key: str, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _kind(value, "a mapping", key, where)
    return value


def _list_of(value: Any, item: type, what: str, key: str, where: str) -> list[Any]:
    if not isinstance(value, list) or not all(isinstance(x, item) for x in value):
        raise _kind(value, what, key, where)
    return value


@dataclass(frozen=True, kw_only=True)
class FileEntry:
    """A file of the version: name (relative to the version directory), size and SHA-256."""

    file: str
    bytes: int
    sha256: str

    @classmethod
    def from_dict(cls, d: Any, where: str) -> "FileEntry":
        if not isinstance(d, dict):
            raise ManifestError(f"{where}: a file entry must be a mapping of file, bytes and sha256, not {_shown(d)}")
        return cls(
            file=check_relative_file(_require(d, "file", where), where),
            bytes=_int(d, "bytes", where),
            sha256=_str(d, "sha256", where),
        )


@dataclass(frozen=True, kw_only=True)
class ShardEntry:
    """One shard and its ``.bos.idx``: ``tokens`` ids, ``documents`` starting in it.

    ``sidecars``: the other files its format keeps beside it (``megatron``'s
    ``.idx``); omitted from the manifest when there are none, so manifests of
    other formats are unchanged.
    """

    file: str
    bytes: int
    sha256: str
    tokens: int
    documents: int
    index: FileEntry
    sidecars: tuple[FileEntry, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if self.sidecars:
            d["sidecars"] = [dataclasses.asdict(s) for s in self.sidecars]
        else:
            del d["sidecars"]
        return d

    @property
    def files(self) -> tuple[FileEntry, ...]:
        """The index and the sidecars: every file of the shard but the shard itself."""
        return (self.index, *self.sidecars)

    @classmethod
    def from_dict(cls, d: Any, where: str) -> "ShardEntry":
        if not isinstance(d, dict):
            raise ManifestError(f"{where}: a shard must be a mapping of file, bytes, sha256, tokens, documents, "
                                f"index, not {_shown(d)}; restore the file or rebuild the version")
        return cls(
            file=check_relative_file(_require(d, "file", where), where),
            bytes=_int(d, "bytes", where),
            sha256=_str(d, "sha256", where),
            tokens=_int(d, "tokens", where),
            documents=_int(d, "documents", where),
            index=FileEntry.from_dict(_require(d, "index", where), where),
            sidecars=_sidecars(d.get("sidecars", []), where),
        )


def _sidecars(items: Any, where: str) -> tuple[FileEntry, ...]:
    if not isinstance(items, list) or not all(isinstance(s, dict) for s in items):
        raise ManifestError(f"{where}: 'sidecars' must be a list of {{file, bytes, sha256}}")
    return tuple(FileEntry.from_dict(s, f"{where}, sidecar {i}") for i, s in enumerate(items))


@dataclass(frozen=True, kw_only=True)
class SplitEntry:
    """A split (``train``, ``val``): its shards in order and its totals."""

    documents: int
    tokens: int
    shards: tuple[ShardEntry, ...]
    extra: dict[str, Any] = field(default_factory=dict)
    """Per-split additions of later stages (e.g. embeddings)."""

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"documents": self.documents, "tokens": self.tokens}
        d["shards"] = [s.to_dict() for s in self.shards]
        d.update(self.extra)
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str, tabled: list[Any] | None = None) -> "SplitEntry":
        """``tabled``: the split's shards from a shard table (schema 4), whose count ``shards`` gives."""
        if not isinstance(d, dict):
            raise ManifestError(f"{where}: a split must be a mapping of documents, tokens and shards, not {_shown(d)}")
        shard_list = _require(d, "shards", where) if tabled is None else tabled
        if not isinstance(shard_list, list) or (tabled is not None and _int(d, "shards", where) != len(tabled)):
            raise _kind(d["shards"], "a list of shards" if tabled is None else f"{len(tabled)}, as the shard table", "shards", where)
        shards = tuple(ShardEntry.from_dict(s, f"{where}, shard {i}") for i, s in enumerate(shard_list))
        extra = {k: v for k, v in d.items() if k not in ("documents", "tokens", "shards")}
        return cls(
            documents=_int(d, "documents", where),
            tokens=_int(d, "tokens", where),
            shards=shards,
            extra=extra,
        )


class BoundaryTokens(NamedTuple):
    """A manifest's ``boundary`` section read whatever its age: the placement and the two tokens."""

    placement: str
    """``bos``, ``eos`` or ``both``."""
    bos: tuple[str, int] | None
    """``(text, id)`` of the token before each document, or None."""
    eos: tuple[str, int] | None
    """``(text, id)`` of the token after each document, or None."""

    def describe(self, text: Callable[[str], str] = str) -> str:
        """``<|endoftext|> = 100257 (bos)`` for one token; ``BOS <|x|> = 1, EOS <|y|> = 2 (both)`` otherwise
        (``text`` shows a token's text: a markdown cell quotes it)."""
        if self.placement != "both":
            tok = self.bos if self.placement == "bos" else self.eos
            if tok is not None:
                return f"{text(tok[0])} = {tok[1]} ({self.placement})"
        parts = [f"{kind} {text(tok[0])} = {tok[1]}" for kind, tok in (("BOS", self.bos), ("EOS", self.eos)) if tok is not None]
        return f"{', '.join(parts)} ({self.placement})"


def boundary_tokens(section: dict[str, Any]) -> BoundaryTokens:
    """The placement and tokens a ``boundary`` section records.

    Sections written before ``both`` existed hold only ``token``, ``token_id`` and
    ``placement`` (the one token, placed as it says); newer ones may add ``bos``
    and ``eos`` (``{token, id}``), which then take precedence.
    """
    placement = str(section["placement"])

    def one(kind: str) -> tuple[str, int] | None:
        sub = section.get(kind)
        if isinstance(sub, dict):
            return str(sub["token"]), int(sub["id"])
        if placement == kind or (placement == "both" and kind == "bos" and "bos" not in section):
            return str(section["token"]), int(section["token_id"])
        return None

    return BoundaryTokens(placement, one("bos"), one("eos"))


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """A published (or staged) version, as ``metadata.yaml`` records it."""

    schema_version: int
    name: str
    version: str
    description: str
    dataset_path: str
    data_content: str
    content_field: str
    tokenized_info: dict[str, Any]
    parent_datasets: list[str]
    format: dict[str, Any]
    boundary: dict[str, Any]
    splits: dict[str, SplitEntry]
    totals: dict[str, Any]
    inputs: list[dict[str, Any]]
    config: dict[str, Any]
    tools: dict[str, Any]
    build_key: str
    created_at: str
    parent: str | None = None
    shard_table: FileEntry | None = None
    """Schema 4: the table that lists the shards (``shardflow.shard_table``); None: the YAML lists them."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Top-level sections added by later stages (e.g. ``embeddings``)."""

    @property
    def dtype(self) -> str:
        return str(self.tokenized_info["dtype"])

    @property
    def boundary_tokens(self) -> BoundaryTokens:
        """The boundary section's placement and its BOS and EOS tokens (see ``boundary_tokens``)."""
        return boundary_tokens(self.boundary)

    @property
    def format_name(self) -> str:
        return str(self.format["name"])

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name in ("splits", "extra") or (f.name == "shard_table" and self.shard_table is None):
                continue
            d[f.name] = dataclasses.asdict(self.shard_table) if f.name == "shard_table" else getattr(self, f.name)
        d["splits"] = {k: v.to_dict() for k, v in self.splits.items()}
        d.update(self.extra)
        return d

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True, width=120)

    def replace(self, **changes: Any) -> "Manifest":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, d: Any, where: str, tables: dict[str, list[Any]] | None = None) -> "Manifest":
        """``tables``: each split's shards from the shard table that a schema-4 ``d`` names (``read_manifest``)."""
        if not isinstance(d, dict):
            raise ManifestError(f"{where}: not a shardflow manifest (expected a mapping at the top level)")
        version = d.get("schema_version")
        if isinstance(version, bool) or version not in READABLE_SCHEMA_VERSIONS:
            raise ManifestError(
                f"{where}: unknown manifest schema_version {version!r}; this shardflow reads schema_version "
                f"{', '.join(map(str, READABLE_SCHEMA_VERSIONS[:-1]))} and {READABLE_SCHEMA_VERSIONS[-1]}. Upgrade shardflow (pip install -U shardflow) or rebuild the dataset"
            )
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name == "extra":
                continue
            if f.name == "splits":
                splits = _require(d, "splits", where)
                if not isinstance(splits, dict):
                    raise ManifestError(f"{where}: 'splits' must be a mapping")
                for k in splits:
                    if not isinstance(k, str) or not k or any(ord(c) < 0x20 for c in k):
                        raise ManifestError(f"{where}: split name {_shown(k)} must be a non-empty string")
                if (version == TABLE_SCHEMA_VERSION) != ("shard_table" in d) or (tables is None) != ("shard_table" not in d):
                    raise ManifestError(f"{where}: a 'shard_table' is read with schema 4 by read_manifest (schema {version})")
                if set(tables or ()) - set(splits):
                    raise ManifestError(f"{where}: its shard table lists shards of splits it has not: {sorted(set(tables or ()) - set(splits))}")
                kwargs["splits"] = {k: SplitEntry.from_dict(v, f"{where}, split {k!r}", None if tables is None else
                                                            tables.get(k, [])) for k, v in splits.items()}
            elif f.name == "shard_table":
                kwargs[f.name] = FileEntry.from_dict(d[f.name], f"{where}, shard_table") if tables is not None else None
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                kwargs[f.name] = _require(d, f.name, where)
            elif f.name in d:
                kwargs[f.name] = d[f.name]
        kwargs["extra"] = {k: v for k, v in d.items() if k not in names}
        _check_fields(kwargs, where)
        return cls(**kwargs)


_STRINGS = ("name", "version", "description", "dataset_path", "data_content", "content_field", "build_key", "created_at")
_MAPPINGS = ("tokenized_info", "format", "boundary", "totals", "config", "tools")


def _check_fields(fields: dict[str, Any], where: str) -> None:
    """The top-level fields' types, and the parts of them readers rely on (dtype, vocab size, boundary)."""
    for key in _STRINGS:
        _str(fields, key, where)
    _str(fields, "parent", where, optional=True)
    for key in _MAPPINGS:
        _mapping(fields[key], key, where)
    _list_of(fields["parent_datasets"], str, "a list of strings", "parent_datasets", where)
    _list_of(fields["inputs"], dict, "a list of mappings", "inputs", where)
    info, info_where = fields["tokenized_info"], f"{where}, tokenized_info"
    if _require(info, "dtype", info_where) not in TOKEN_DTYPES:
        raise _kind(info["dtype"], " or ".join(TOKEN_DTYPES), "dtype", info_where)
    _int(info, "vocab_size", info_where)
    for key in ("tokenizer_file", "rank_file"):
        if key in info:
            _str(info, key, info_where)
    _str(fields["format"], "name", f"{where}, format")
    boundary = fields["boundary"]
    if boundary.get("placement") not in ("bos", "eos", "both"):
        raise _kind(boundary.get("placement"), "bos, eos or both", "placement", f"{where}, boundary")
    try:
        boundary_tokens(boundary)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ManifestError(
            f"{where}, boundary: not a boundary section ({type(exc).__name__}: {_shown(exc.args[0] if exc.args else '')}); "
            "restore the file or rebuild the version"
        ) from None


def read_manifest(path: Path | str, *, table_file: Callable[[FileEntry], Path] | None = None) -> Manifest:
    """Parse a ``metadata.yaml`` (bounded safe loader, ``_yaml``) into a ``Manifest``, with its shard table if it
    names one (schema 4: beside it, else where ``table_file(entry)`` says; checked against the entry)."""
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST_NAME
    try:
        data = load_yaml_file(path, max_bytes=MAX_MANIFEST_BYTES, unique=UNIQUE_FILES)
    except FileNotFoundError:
        raise ManifestError(f"{path}: no manifest here; is this a published version directory?") from None
    except YamlRepeated as exc:
        raise ManifestError(_repeated_shard(path, exc.value, f"{exc.first} and {exc.where}, line {exc.line}")) from None
    except YamlRefused as exc:
        raise ManifestError(f"{path}: refused: {exc}; restore the file or rebuild the version") from None
    except yaml.YAMLError as exc:
        raise ManifestError(f"{path}: not valid YAML ({describe_yaml_error(exc)})") from None
    tables = None
    if isinstance(data, dict) and data.get("schema_version") == TABLE_SCHEMA_VERSION and "shard_table" in data:
        entry = FileEntry.from_dict(data["shard_table"], f"{path}, shard_table")
        where = table_file(entry) if table_file is not None else version_file(path.parent, entry.file, "shard_table")
        tables = read_table(where, entry.bytes, entry.sha256, str(path))
    manifest = Manifest.from_dict(data, str(path), tables)
    # Listings the parser did not see as text (aliases of one entry) are caught on the result.
    seen: dict[str, str] = {}
    for split, entry in manifest.splits.items():
        for k, shard in enumerate(entry.shards):
            here = f"splits.{split}.shards[{k}].file"
            first = seen.setdefault(shard.file, here)
            if first != here:
                raise ManifestError(_repeated_shard(path, shard.file, f"{first} and {here}"))
    return manifest


def _repeated_shard(path: Path, file: str, where: str) -> str:
    return (
        f"{path}: lists the shard {file} more than once ({where}); a version lists each shard once, so this "
        "manifest was changed or is corrupt: rebuild the version or restore its metadata.yaml"
    )


def shard_table_wanted(manifest: Manifest) -> bool:
    """Whether a build writes ``manifest`` with a shard table (schema 4): a version of shards of whole documents
    (schema 3 and later; a schema-2 parent's embedding keeps its shards in the YAML) of more than
    ``SHARD_TABLE_ABOVE`` shards, all splits together. Read at each call, so a test may lower the constant."""
    shards = sum(len(s.shards) for s in manifest.splits.values())
    return manifest.schema_version >= SCHEMA_VERSION and shards > SHARD_TABLE_ABOVE


def write_manifest(directory: Path, manifest: Manifest, *, shard_table: bool | None = None) -> Path:
    """Write ``metadata.yaml`` atomically into ``directory``; returns its path. ``shard_table``: list the shards
    in a table beside it (schema 4, ``shardflow.shard_table``; builds ask for one where ``shard_table_wanted``);
    None: as the manifest was read (with one or not)."""
    path = Path(directory) / MANIFEST_NAME
    if shard_table or (shard_table is None and manifest.shard_table is not None):
        atomic_write_text(path, tabled_yaml(Path(directory), manifest.to_dict()))
    else:
        atomic_write_text(path, manifest.replace(shard_table=None, schema_version=min(manifest.schema_version, SCHEMA_VERSION)).to_yaml())
    return path
