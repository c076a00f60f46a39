"""Discovery: expand files, directories, globs and directory layouts into an ordered list of inputs.

This is the one place that walks the file system. It knows no input kind by
name: the registry it is given says which files a directory scan picks up
(their suffixes), which kind each file is (``detect``), and what the message
for an unsupported file lists; the directory layouts it is given (a saved
``datasets`` dataset) expand their directories themselves.
"""

from __future__ import annotations

import dataclasses
import glob as globmod
import os
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from ..errors import InputError
from .base import DirectoryLayout, InputFile, InputKind, file_name, has_suffix
from .storage import glob_base, is_remote, list_objects, local_path

__all__ = ["discover", "input_suffixes", "detect_kind"]


def input_suffixes(kinds: Mapping[str, InputKind]) -> tuple[str, ...]:
    """Every suffix of ``kinds``, each once, in registry order."""
    return tuple(dict.fromkeys(s for kind in kinds.values() for s in kind.suffixes))


def _families(kinds: Mapping[str, InputKind]) -> dict[str, list[str]]:
    """Label -> suffixes, in registry order (the Arrow file and stream kinds are one family)."""
    out: dict[str, list[str]] = {}
    for kind in kinds.values():
        suffixes = out.setdefault(kind.label, [])
        suffixes += [s for s in kind.suffixes if s not in suffixes]
    return out


def _either(words: Sequence[str]) -> str:
    """``"A"``, ``"A or B"``, ``"A, B or C"``."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def detect_kind(path: Path | str, kinds: Mapping[str, InputKind]) -> str:
    """The name of the first kind that claims ``path`` (a path or a URL); an ``InputError`` lists the supported files."""
    for kind in kinds.values():
        name = kind.detect(path)
        if name is not None:
            return name
    listing = _either([f"{label} ({', '.join(suffixes)})" for label, suffixes in _families(kinds).items()])
    suffix = PurePosixPath(file_name(path)).suffix
    raise InputError(f"{path}: unsupported file type {suffix or '(none)'!r}; inputs are {listing} files")


_SAVED_DATASET_FILES = ("state.json", "dataset_dict.json")


def _remote(spec: str, kinds: Mapping[str, InputKind]) -> list[InputFile]:
    """The objects a URL names, from one listing: sizes and storage identities, no content read."""
    suffixes = input_suffixes(kinds)
    layout_files: list[str] = []

    def wanted(rel: str) -> bool:
        if rel in _SAVED_DATASET_FILES:
            layout_files.append(rel)
        name = PurePosixPath(rel).name
        return has_suffix(name, suffixes) and not name.startswith(".")

    listed = list_objects(spec, wanted)
    if layout_files:
        # Its order is in state.json, which the directory layouts read from local directories only.
        raise InputError(
            f"{spec}: a saved datasets directory ({layout_files[0]}) on object storage is not read in place; "
            "copy it to a local or shared directory, or save it as Parquet (Dataset.to_parquet) and build from that"
        )
    found = []
    for url, relname, size, ident in listed:
        if size == 0:
            raise InputError(f"{url}: the object is empty (0 bytes); remove it or regenerate it")
        found.append(InputFile(path=url, relname=relname, kind=detect_kind(url, kinds), size=size, identity=ident))
    return found


def _is_glob(spec: str) -> bool:
    return any(ch in spec for ch in "*?[")


def _input(path: Path, relname: str, kinds: Mapping[str, InputKind], kind: str | None = None) -> InputFile:
    size = path.stat().st_size
    if size == 0:
        raise InputError(f"{path}: the file is empty (0 bytes); remove it or regenerate it")
    return InputFile(path=str(path.resolve()), relname=relname, kind=kind or detect_kind(path, kinds), size=size)


def discover(
    specs: tuple[str, ...] | list[str], kinds: Mapping[str, InputKind], layouts: Sequence[DirectoryLayout]
) -> list[InputFile]:
    """Expand files, directories, globs and directory layouts into an ordered list of inputs."""
    found: list[InputFile] = []
    labels: list[str] = []  # per input: the name of the directory its relname is relative to
    for spec in specs:
        before = len(found)
        spec = local_path(spec)  # file:// is a local path
        if is_remote(spec):  # read in place: listed here, read by the workers
            found.extend(_remote(spec, kinds))
            key = PurePosixPath(glob_base(spec.split("://", 1)[1]) if _is_glob(spec) else spec.split("://", 1)[1])
            # As for a local path: a directory's (prefix's) own name, or a file's (object's) directory's.
            # Whether the URL is one object, its listing says: a prefix may hold a dot (s3://b/wiki.v1/).
            one_object = not _is_glob(spec) and len(found) - before == 1 and found[-1].path == spec
            labels.extend([key.parent.name if one_object else key.name] * (len(found) - before))
            continue
        if _is_glob(spec):
            matches = sorted(globmod.glob(spec, recursive=True))
            base = Path(spec.split("*")[0].split("?")[0].split("[")[0])
            base = base if spec.endswith(os.sep) or base.is_dir() else base.parent
            if "**" in spec:  # glob skips a directory it cannot read without a word
                _files_under(base, spec)
            matches = [m for m in matches if _is_input_file(Path(m))]
            if not matches:
                raise InputError(f"{spec}: the pattern matches no files; check the path and the pattern")
            found.extend(_input(Path(m), os.path.relpath(m, base), kinds) for m in matches)
            labels.extend([Path(os.path.abspath(base)).name] * (len(found) - before))
            continue
        path = Path(spec).expanduser()
        if not path.exists():
            raise InputError(f"{spec}: no such file or directory; check the path")
        if path.is_dir():
            expanded = next((e for e in (layout.expand(path, spec) for layout in layouts) if e is not None), None)
            if expanded is not None:
                found.extend(_input(file, relname, kinds, kind) for file, relname, kind in expanded)
                labels.extend([path.resolve().name] * (len(found) - before))
                continue
            suffixes = input_suffixes(kinds)
            files = [p for p in _files_under(path, spec)
                     if has_suffix(p.name, suffixes) and not p.name.startswith(".") and _is_input_file(p)]
            if not files:
                raise InputError(
                    f"{spec}: the directory has no {_either(list(_families(kinds)))} files ({', '.join(suffixes)})"
                )
            found.extend(_input(p, p.relative_to(path).as_posix(), kinds) for p in files)
        else:
            found.append(_input(path, path.name, kinds))
        labels.extend([path.resolve().parent.name if path.is_file() else path.resolve().name] * (len(found) - before))
    return _distinct_relnames(found, labels)


def _files_under(path: Path, spec: str) -> list[Path]:
    """The paths of the files below ``path``, sorted (symlinked directories not followed). A directory that cannot be
    listed is an error: skipping it would publish a version without its inputs (a rebuild after a
    ``chmod`` would silently remove them); so is a broken link, in ``_is_input_file``."""

    def refuse(err: OSError) -> None:
        raise InputError(f"{spec}: cannot list the directory {err.filename} ({err.strerror}); make it readable, "
                         "or move it out of the input directory")

    return sorted(Path(root) / name for root, _, names in os.walk(path, onerror=refuse) for name in names)


def _is_input_file(path: Path) -> bool:
    """``path`` is a regular file (through any link); a broken link is an error, anything else is skipped."""
    if path.is_file():
        return True
    if path.is_symlink() and not path.exists():
        raise InputError(f"{path}: a broken symbolic link (to {os.readlink(path)}); fix its target or remove it")
    return False


def _distinct_relnames(found: list[InputFile], labels: list[str]) -> list[InputFile]:
    """Refuse a file given twice; qualify clashing names (``a/part-0.parquet``, ``b/part-0.parquet``).

    When no two names clash, every name stays as it is, so the manifest, the held-out
    split and incremental reuse of existing datasets do not change.
    """
    by_path: dict[str, str] = {}
    for inp in found:
        if inp.path in by_path:
            raise InputError(f"{inp.path}: the file is given twice, as {by_path[inp.path]} and as {inp.relname} (two "
                             "sources, or a link to it); give it once")
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
