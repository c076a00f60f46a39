"""Content fingerprints of the inputs (SHA-256), with a stat-keyed cache so unchanged files are not re-read.

The fingerprint is of the file's bytes, whatever its kind: it is what the build
key and incremental reuse compare. Objects on object storage are not read by
planning: the storage's identity of each (ETag, version id, from the listing)
stands in for it while planning, and the worker that reads the object hashes
it (``pipeline/tokenize.py``). Local files are not read by planning either when
nothing planning could decide depends on their bytes (``hash_now`` says which
must be; ``pipeline/plan.py`` says why): such a file's stat stands in for its
hash in the plan, the worker that reads its first unit hashes it as it reads
it (``sources/hashing.py``), and records the hash here (``record_fingerprints``),
so the next build knows it without reading the file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .._io import atomic_write_text, sha256_file
from ..errors import InputError
from .base import InputFile
from .storage import hash_input, is_remote

__all__ = ["fingerprint_inputs", "cached_hashes", "local_stat", "record_fingerprints"]

# A file rewritten while it is hashed: hashed again this many times before planning gives up.
_HASH_ATTEMPTS = 3


def local_stat(path: str) -> str:
    """A local file's ``size:mtime_ns:ctime_ns:inode``: what changes when its bytes may have (like git's index).

    ctime too: a rewrite that keeps size and mtime (``cp -p``, ``rsync -t``, ``os.utime``) still changes it.
    """
    st = os.stat(path)
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"


def _fingerprint_cache_path(cache_dir: Path | None) -> Path | None:
    return None if cache_dir is None else Path(cache_dir) / ".fingerprints.json"


def _read_cache(cache_file: Path | None) -> dict[str, Any]:
    if cache_file is None or not cache_file.exists():
        return {}
    try:
        cache = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        return {}
    return cache if isinstance(cache, dict) else {}


@contextlib.contextmanager
def _cache_locked(cache_file: Path) -> Iterator[None]:
    """The cache's lock, a ``flock`` on its directory (no file of its own): planning and the workers that hash
    inputs update the cache."""
    fd = os.open(cache_file.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (releases the lock)


def record_fingerprints(cache_dir: Path | str | None, entries: dict[str, tuple[str, str]]) -> None:
    """Add ``{path: (stat, sha256)}`` to the cache of ``cache_dir``: the stat taken before the bytes were hashed,
    and still theirs after. Merged under the cache's lock with what others recorded meanwhile; a cache whose
    directory is missing or that cannot be written is left as it is (it is an optimisation only)."""
    cache_file = _fingerprint_cache_path(None if cache_dir is None else Path(cache_dir))
    if cache_file is None or not entries:
        return
    try:
        with _cache_locked(cache_file):
            cache = _read_cache(cache_file)
            new = {path: {"stat": stat, "sha256": sha} for path, (stat, sha) in entries.items()}
            if all(cache.get(path) == entry for path, entry in new.items()):
                return
            cache.update(new)
            atomic_write_text(cache_file, json.dumps(cache, indent=0, sort_keys=True))
    except OSError:
        pass


def cached_hashes(inputs: list[InputFile] | tuple[InputFile, ...], cache_dir: Path | str | None) -> list[InputFile]:
    """``inputs`` with the SHA-256 the cache of ``cache_dir`` holds for each local file without one that is still
    as planned (its stat unchanged since, the cache's entry for that stat); reads no file."""
    cache = _read_cache(_fingerprint_cache_path(None if cache_dir is None else Path(cache_dir)))
    out = []
    for inp in inputs:
        hit = cache.get(inp.path) if not inp.sha256 and inp.stat else None
        try:
            known = isinstance(hit, dict) and hit.get("stat") == inp.stat == local_stat(inp.path)
        except OSError:
            known = False
        out.append(InputFile(**{**inp.to_dict(), "sha256": str(hit["sha256"])}) if known else inp)  # type: ignore[index]
    return out


def fingerprint_inputs(
    inputs: list[InputFile], cache_dir: Path | None = None, *, hash_now: Callable[[InputFile], bool] | None = None
) -> list[InputFile]:
    """Attach each input's SHA-256 (its content fingerprint), reusing a stat-keyed cache.

    Hashing reads every byte once; the cache (keyed by path, size, mtime and
    inode, like git's index) makes a rebuild over unchanged files cheap.
    ``hash_now``: which local files that the cache does not know are hashed
    here (None: all); the others keep an empty ``sha256`` (their ``stat``
    recorded), for the worker that reads them to hash.
    """
    from concurrent.futures import ThreadPoolExecutor

    cache_file = _fingerprint_cache_path(cache_dir)
    cache = _read_cache(cache_file)

    def known(inp: InputFile) -> tuple[str, str]:
        """``(stat, sha256)`` from the cache; the sha256 empty when it does not know the file as it is now."""
        key = local_stat(inp.path)
        hit = cache.get(inp.path)
        return key, str(hit["sha256"]) if isinstance(hit, dict) and hit.get("stat") == key else ""

    def digest(inp: InputFile) -> tuple[str, str]:
        """``(stat, sha256)``: the stat taken before the bytes were hashed, and still theirs after."""
        if is_remote(inp.path):
            # Identified by the storage (ETag, version id): hashed later by the worker that reads it.
            # A store that reports no identity leaves no choice but to read it here.
            return "", "" if inp.identity else hash_input(inp.path)
        for _ in range(_HASH_ATTEMPTS):
            key, sha = known(inp)
            if sha:
                return key, sha
            sha = sha256_file(Path(inp.path))
            if local_stat(inp.path) == key:
                return key, sha
        raise InputError(f"{inp.path}: changed each time it was hashed ({_HASH_ATTEMPTS} times); build again once "
                         "nothing writes it")

    looked = [("", "") if is_remote(inp.path) else known(inp) for inp in inputs]
    # Remote objects are identified by the storage; local files the cache knows are done; of the others, those
    # ``hash_now`` chooses are hashed here, and the rest are left to their reader.
    todo = [
        n for n, (inp, (_, sha)) in enumerate(zip(inputs, looked))
        if (is_remote(inp.path) and not inp.identity) or (not is_remote(inp.path) and not sha and (hash_now is None or hash_now(inp)))
    ]
    # hashlib releases the GIL on large buffers, so threads hash files in parallel.
    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        for n, got in zip(todo, pool.map(digest, [inputs[n] for n in todo])):
            looked[n] = got
    out = [InputFile(**{**inp.to_dict(), "sha256": sha, "stat": key}) for inp, (key, sha) in zip(inputs, looked)]
    hashed = {inputs[n].path: looked[n] for n in todo if not is_remote(inputs[n].path)}
    if cache_file is not None and hashed:
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass
        record_fingerprints(cache_dir, hashed)
    return out
