"""Content fingerprints of the inputs (SHA-256), with a stat-keyed cache so unchanged files are not re-read.

The fingerprint is of the file's bytes, whatever its kind: it is what the build
key and incremental reuse compare. Objects on object storage are the
exception: the storage's identity of each (ETag, version id, from the listing)
stands in for it while planning, and the worker that reads the object hashes
it (``pipeline/tokenize.py``), so planning never reads the corpus.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .._io import atomic_write_text, sha256_file
from ..errors import InputError
from .base import InputFile
from .storage import hash_input, is_remote

__all__ = ["fingerprint_inputs", "local_stat"]

# A file rewritten while it is hashed: hashed again this many times before planning gives up.
_HASH_ATTEMPTS = 3


def local_stat(path: str) -> str:
    """A local file's ``size:mtime_ns:ctime_ns:inode``: what changes when its bytes may have (like git's index).

    ctime too: a rewrite that keeps size and mtime (``cp -p``, ``rsync -t``, ``os.utime``) still changes it.
    """
    st = os.stat(path)
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"


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

    def digest(inp: InputFile) -> tuple[str, str]:
        """``(stat, sha256)``: the stat taken before the bytes were hashed, and still theirs after."""
        if is_remote(inp.path):
            # Identified by the storage (ETag, version id): hashed later by the worker that reads it.
            # A store that reports no identity leaves no choice but to read it here.
            return "", "" if inp.identity else hash_input(inp.path)
        for _ in range(_HASH_ATTEMPTS):
            key = local_stat(inp.path)
            hit = cache.get(inp.path)
            if hit and hit.get("stat") == key:
                return key, str(hit["sha256"])
            sha = sha256_file(Path(inp.path))
            if local_stat(inp.path) == key:
                return key, sha
        raise InputError(f"{inp.path}: changed each time it was hashed ({_HASH_ATTEMPTS} times); build again once "
                         "nothing writes it")

    # hashlib releases the GIL on large buffers, so threads hash files in parallel.
    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        digests = list(pool.map(digest, inputs))
    out = [InputFile(**{**inp.to_dict(), "sha256": sha, "stat": key}) for inp, (key, sha) in zip(inputs, digests)]
    if cache_file is not None:
        for inp in out:
            if is_remote(inp.path):
                continue
            cache[inp.path] = {"stat": inp.stat, "sha256": inp.sha256}
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(cache_file, json.dumps(cache, indent=0, sort_keys=True))
        except OSError:
            pass  # the cache is an optimisation only
    return out
