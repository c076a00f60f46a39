"""The shard table: a version's shard entries in one compact text file beside its manifest (manifest schema 4).

A manifest lists every shard of every split in YAML: for 35,000 shards that is 12 MB, which PyYAML
loads in about 5 s, even with libyaml (an open takes 7 s: docs/RUNTIME.md, "Opening"). A schema-4 manifest keeps
everything else in YAML but gives each split's shard *count* (``splits.<split>.shards: N``) and names
the table, ``shard_table: {file: shards.tsv, bytes, sha256}``, which holds the same entries, one line
per shard, tab-separated: 35,000 of them parse in about 0.15 s (0.5 s with the entries built). The
catalog records the manifest's SHA-256 and the manifest the table's, so a reader trusts the table
exactly as far as the manifest: ``read_table`` checks its size and SHA-256 before it reads a line,
and every field of every line as strictly as the YAML's. This module turns bytes into the entries'
mappings (as the YAML holds them) and back; ``shardflow.manifest`` reads them into its types
(``ShardEntry.from_dict``: file names checked there, as for every manifest), from ``read_manifest``
and ``write_manifest``.

A manifest is written with a table when asked (``write_manifest(..., shard_table=True)``), as builds ask for
a version of more than ``manifest.SHARD_TABLE_ABOVE`` shards (``manifest.shard_table_wanted``), or when the
manifest it was read from had one (publishing rewrites it, and keeps the table). Byte layout:
docs/FORMAT.md ("The shard table").
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import yaml

from ._io import atomic_write_bytes
from .errors import ManifestError

__all__ = [
    "TABLE_SCHEMA_VERSION", "TABLE_NAME", "TABLE_MAGIC", "MAX_TABLE_BYTES", "encode_table", "decode_table", "read_table",
    "tabled_yaml",
]

TABLE_SCHEMA_VERSION = 4
"""The manifest schema whose shards are in a shard table: schema 3 otherwise."""
TABLE_NAME = "shards.tsv"
"""The table's file name in the version directory, as ``write_manifest`` names it."""
TABLE_MAGIC = b"shardflow shard table 1\n"
"""The table's first line: its format and the format's version."""
MAX_TABLE_BYTES = 128 << 20
"""The largest table read: a line is about 220 bytes, so some 600,000 shards (the YAML's node limit admits about
400,000, ``_yaml.MAX_NODES``); what it holds in memory stays of the same order."""

_INT = "(0|[1-9][0-9]{0,18})"  # at most 19 digits: every count fits an int64
_SHA = "([0-9a-f]{64})"
_FILE = "([^\t]+)"
_LINE = re.compile(f"{_FILE}\t{_FILE}\t{_INT}\t{_SHA}\t{_INT}\t{_INT}\t{_FILE}\t{_INT}\t{_SHA}((?:\t{_FILE}\t{_INT}\t{_SHA})*)")
_SIDECAR = re.compile(f"\t{_FILE}\t{_INT}\t{_SHA}")


def _line(split: str, s: dict[str, Any]) -> str:
    index = s["index"]
    fields = [split, s["file"], s["bytes"], s["sha256"], s["tokens"], s["documents"], index["file"], index["bytes"],
              index["sha256"]]
    for f in s.get("sidecars", ()):
        fields += [f["file"], f["bytes"], f["sha256"]]
    line = "\t".join(map(str, fields))
    if not _LINE.fullmatch(line):
        raise ManifestError(f"split {split!r}, shard {s['file']!r}: not writable in a shard table (a name with a tab "
                            "or newline, a negative count, or a SHA-256 that is not 64 lowercase hex digits)")
    return line


def encode_table(splits: dict[str, Any]) -> bytes:
    """The table of the shards of ``splits`` (a manifest's ``splits`` as its YAML holds them: each a mapping whose
    ``shards`` lists ``{file, bytes, sha256, tokens, documents, index, sidecars}``): the magic line, then one line
    per shard, split by split in order."""
    lines = [_line(split, s) for split, entry in splits.items() for s in entry["shards"]]
    return TABLE_MAGIC + "".join(line + "\n" for line in lines).encode("utf-8")


def decode_table(data: bytes, where: str) -> dict[str, list[dict[str, Any]]]:
    """``{split: [shard entries]}`` from a table's bytes, splits in the order the table lists them, each entry the
    mapping a manifest's YAML would hold (``sidecars`` only where there are some).

    Refuses (``ManifestError`` naming ``where`` and the line) a table that is not UTF-8, lacks the magic line
    or the final newline, holds a line of other fields, or lists one split in two runs of lines.
    """
    if not data.startswith(TABLE_MAGIC):
        raise ManifestError(f"{where}: not a shard table (its first line is not {TABLE_MAGIC.decode().strip()!r})")
    if not data.endswith(b"\n"):
        raise ManifestError(f"{where}: the shard table does not end with a newline; it is truncated")
    try:
        text = data[len(TABLE_MAGIC):].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{where}: the shard table is not UTF-8 (invalid byte at offset {exc.start})") from None
    out: dict[str, list[dict[str, Any]]] = {}
    current: list[dict[str, Any]] = []
    split = None
    for n, line in enumerate(text.split("\n")[:-1], start=2):
        m = _LINE.fullmatch(line)
        if m is None:
            raise ManifestError(f"{where}, line {n}: not a line of a shard table (9 tab-separated fields, then "
                                "3 per sidecar: names, decimal counts, 64 lowercase hex digits)")
        name, file, size, sha, tokens, documents, ifile, isize, isha, rest = m.groups()[:10]
        if name != split:
            if name in out:
                raise ManifestError(f"{where}, line {n}: split {name!r} is listed in two runs of lines")
            split, current = name, out.setdefault(name, [])
        entry = {"file": file, "bytes": int(size), "sha256": sha, "tokens": int(tokens), "documents": int(documents),
                 "index": {"file": ifile, "bytes": int(isize), "sha256": isha}}
        if rest:
            entry["sidecars"] = [{"file": f, "bytes": int(b), "sha256": h} for f, b, h in _SIDECAR.findall(rest)]
        current.append(entry)
    return out


def read_table(path: Path, size: int, sha256: str, where: str) -> dict[str, list[dict[str, Any]]]:
    """``decode_table`` of the file at ``path``, after checking that it is the table the manifest ``where`` names:
    ``size`` bytes of SHA-256 ``sha256``. One open, one read."""
    if size > MAX_TABLE_BYTES:
        raise ManifestError(f"{where}: its shard table {path.name} is of {size:,} bytes, more than the "
                            f"{MAX_TABLE_BYTES:,} shardflow reads")
    try:
        with open(path, "rb") as f:
            data = f.read(size + 1)
    except FileNotFoundError:
        raise ManifestError(f"{path}: missing; {where} names it as its shard table. Restore it (shardflow validate "
                            "shows what else is missing), or rebuild the version") from None
    if len(data) != size or hashlib.sha256(data).hexdigest() != sha256:
        raise ManifestError(f"{path}: not the shard table {where} names ({len(data):,} bytes, manifest: {size:,}; "
                            "or its SHA-256 differs): the table was changed or is damaged; restore it or rebuild the version")
    return decode_table(data, str(path))


def tabled_yaml(directory: Path, d: dict[str, Any]) -> str:
    """The YAML of the manifest ``d`` (``Manifest.to_dict()``, its shards listed) as schema 4, after writing its
    table into ``directory`` (atomically: the table is in place before the manifest that names it)."""
    if d["schema_version"] < 3:
        raise ManifestError(f"{d['name']}@{d['version']}: a shard table is for whole-document shards (schema 3 and "
                            f"later), not schema {d['schema_version']}")
    name = d.get("shard_table", {}).get("file", TABLE_NAME)
    data = encode_table(d["splits"])
    atomic_write_bytes(directory / name, data)
    out: dict[str, Any] = {}
    for key, value in d.items():
        if key == "splits":  # the table's entry just before the splits it lists, however the manifest came
            out["shard_table"] = {"file": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            out["splits"] = {k: {**v, "shards": len(v["shards"])} for k, v in value.items()}
        elif key != "shard_table":
            out[key] = value
    out["schema_version"] = TABLE_SCHEMA_VERSION
    return yaml.safe_dump(out, sort_keys=False, allow_unicode=True, width=120)
