"""Sources given as URLs: telling a URL from a path, and ``file://`` URLs as local paths.

URL sources are no longer mirrored anywhere: an fsspec URL (``s3://bucket/corpus/``,
``gs://...``, ``memory://...``) goes to planning as it is, and the core lists
it and reads its objects in place on the workers (``shardflow.sources.storage``).
What is left here are the helpers the command line uses.

No Prefect import here: the CLI's ``--no-prefect`` path uses it too.
"""

from __future__ import annotations

import re

from shardflow.sources.storage import local_path

__all__ = ["is_url", "file_url_to_path"]

_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


def is_url(spec: str) -> bool:
    return bool(_URL_RE.match(spec))


def file_url_to_path(url: str) -> str:
    """``file:///data/x.parquet`` (or ``file://localhost/...``) to ``/data/x.parquet``."""
    if not url.lower().startswith("file://"):
        raise ValueError(f"not a file:// URL: {url}")
    return local_path(url)
