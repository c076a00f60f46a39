"""A bucket version built again from what its manifest records, for ``push --repair`` to restore files that no
local copy has (``bucket/repair.py``).

Builds are deterministic: the same inputs, options and tokenizer give the same bytes. Where this machine has
no verified copy of a damaged object (a build to the bucket keeps none once its scratch is gone),
``rebuild_version`` builds the version again from the configuration and the inputs its manifest records into
a temporary local data root and catalog, never the bucket's: nothing is published or listed anywhere. The
repair then sends each rebuilt file whose size and SHA-256 are the manifest's, and only those.

The whole version is rebuilt, not only the work units behind the damaged files: the layout numbers every
shard over all the units' results (and a gathered split is one stream cut from every unit's documents), so no
shard can be written before every unit is tokenized; tokenizing is the cost, and the other shards are links.

Before anything is tokenized, the inputs are found again from the recorded sources and compared with the
manifest's, by relative name, size and SHA-256 (an object on object storage by its storage identity; where
that changed, by the SHA-256 the rebuild read, compared after it). A tokenizer file that is no longer where
the build found it is taken from the version itself: its verified copy (``tokenizer_file``).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..config import BuildConfig
from ..errors import ShardflowError, ValidationError
from ..manifest import Manifest, read_manifest
from ..pipeline.run import build
from ..sources import InputFile, discover_inputs, fingerprint_inputs

__all__ = ["Rebuild", "RebuildError", "rebuild_version"]


class RebuildError(ValidationError):
    """The version cannot be rebuilt here; the message says why (an input changed or gone, the tokenizer
    missing, the build failing), for the repair's message to name."""


@dataclass(frozen=True, kw_only=True)
class Rebuild:
    """A rebuilt version: its directory (under the temporary directory given) and the sources it was built from."""

    directory: Path
    sources: tuple[str, ...]


def _shown(sha: Any) -> str:
    return f"{sha[:16]}..." if isinstance(sha, str) and sha else "(none)"


def _changed_inputs(recorded: list[dict[str, Any]], found: list[InputFile], *, hashed: bool) -> list[str]:
    """The inputs of ``found`` (or of ``recorded``) that are not the ones the build read, each with what differs.

    ``hashed``: every one of ``found`` has its SHA-256 (a rebuild's manifest); else an object known only by its
    storage identity is compared by that, and a changed identity is left for the SHA-256 the rebuild reads."""
    theirs = {e.get("relname"): e for e in recorded if isinstance(e, dict)}
    ours = {inp.relname: inp for inp in found}
    changed = [f"{e.get('path') or name} (gone)" for name, e in theirs.items() if name not in ours]
    for name, inp in ours.items():
        e = theirs.get(name)
        if e is None:
            changed.append(f"{inp.path} (not an input of the build)")
        elif inp.size != e.get("size"):
            changed.append(f"{inp.path} ({inp.size} bytes, the build read {e.get('size')})")
        elif not hashed and inp.identity and not inp.sha256:
            continue  # an object: its identity says whether it changed, or the rebuild's SHA-256 will
        elif inp.sha256 != e.get("sha256"):
            changed.append(f"{inp.path} (SHA-256 {_shown(inp.sha256)}, the build read {_shown(e.get('sha256'))})")
    return changed


def _unchanged_objects(recorded: list[dict[str, Any]], found: list[InputFile]) -> list[InputFile]:
    """``found`` with an object's SHA-256 taken from the manifest where its storage identity is the one recorded."""
    theirs = {e.get("relname"): e for e in recorded if isinstance(e, dict)}
    out = []
    for inp in found:
        e = theirs.get(inp.relname) or {}
        if inp.identity and not inp.sha256 and e.get("identity") == inp.identity and isinstance(e.get("sha256"), str):
            inp = dataclasses.replace(inp, sha256=e["sha256"])
        out.append(inp)
    return out


def _tokenizer(config: BuildConfig, manifest: Manifest, tokenizer_file: Callable[[str], Path | None]) -> BuildConfig:
    """``config``, its tokenizer the version's verified copy where the file the build was given is not here."""
    given = config.tokenizer
    copy = manifest.tokenized_info.get("rank_file") or manifest.tokenized_info.get("tokenizer_file")
    if not isinstance(copy, str) or not isinstance(given, str) or "://" in given or Path(given).expanduser().exists():
        return config
    path = tokenizer_file(copy)
    if path is None:
        raise RebuildError(f"its tokenizer {given} is not on this machine, nor a verified copy of the version's {copy}")
    return dataclasses.replace(config, tokenizer=str(path))


def rebuild_version(manifest: Manifest, into: str | os.PathLike[str], *,
                    tokenizer_file: Callable[[str], Path | None], workers: int = 1,
                    starting: Callable[[], None] | None = None) -> Rebuild:
    """Build the version ``manifest`` describes again, from the inputs and options it records, into the local
    directory ``into`` (its ``data/`` and ``catalog/``; nothing published elsewhere). ``tokenizer_file(name)``:
    a verified copy of the version's file ``name`` (its tokenizer's), named so, or None; ``starting()``: called
    once the inputs are found to be the build's, before the build (as long as the first). Raises ``RebuildError``
    where the inputs are gone or not the ones the build read, or the build fails."""
    into = Path(into)
    data_root = into / "data"
    try:
        config = BuildConfig.from_dict(manifest.config)
    except (ShardflowError, TypeError, ValueError) as exc:
        raise RebuildError(f"its recorded options do not make a build here ({exc})") from None
    sources = tuple(config.sources)
    config = _tokenizer(config, manifest, tokenizer_file)
    try:
        # Hashed into the rebuild's own cache of fingerprints, which its planning then reads instead of the files.
        found = fingerprint_inputs(discover_inputs(list(sources)), cache_dir=data_root / config.name)
    except (ShardflowError, OSError) as exc:
        raise RebuildError(f"its inputs cannot be read ({exc})") from None
    changed = _changed_inputs(manifest.inputs, _unchanged_objects(manifest.inputs, found), hashed=False)
    if changed:
        raise RebuildError(f"its inputs changed since the build: {', '.join(changed)}")
    if starting is not None:
        starting()
    try:
        result = build(config, data_root=data_root, catalog=into / "catalog", workers=max(1, workers))
        rebuilt = read_manifest(Path(result.manifest_path).parent)
    except (ShardflowError, OSError) as exc:
        raise RebuildError(f"the rebuild failed ({exc})") from None
    read = [InputFile(path=str(e.get("path")), relname=str(e.get("relname")), kind=str(e.get("kind")),
                      size=int(e.get("size") or 0), sha256=str(e.get("sha256") or ""))
            for e in rebuilt.inputs if isinstance(e, dict)]
    changed = _changed_inputs(manifest.inputs, read, hashed=True)  # objects whose identity changed: now hashed
    if changed:
        raise RebuildError(f"its inputs changed since the build: {', '.join(changed)}")
    return Rebuild(directory=Path(result.manifest_path).parent, sources=sources)
