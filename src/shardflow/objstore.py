"""URLs on object storage, as every part of shardflow reads them: which paths are URLs, and fsspec's filesystem.

One rule for the build's inputs (``sources/storage.py``) and the runtime's
versions (``runtime/objstore.py``), here because the training runtime must not
import pyarrow (``sources`` does): a URL is anything ``scheme://`` but
``file://``; endpoints and credentials come from the environment
(``AWS_*``, ``AWS_ENDPOINT_URL``), never from the URL; a missing fsspec or
s3fs names ``pip install 'shardflow[s3]'``.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlparse

from .errors import InputError

__all__ = ["is_remote", "check_no_credentials", "filesystem", "redacted"]

_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


def is_remote(path: str) -> bool:
    """Whether ``path`` is a URL other than ``file://`` (read through fsspec)."""
    return bool(_URL_RE.match(path)) and not path.lower().startswith("file://")


def redacted(url: str) -> str:
    """``url`` without a user name or secret in it (what a message may show)."""
    parsed = urlparse(url)
    return parsed._replace(netloc=parsed.hostname or "").geturl()


def check_no_credentials(url: str) -> None:
    """Refuse a URL that carries a user name or a secret (``s3://KEY:SECRET@bucket/...``)."""
    parsed = urlparse(url)
    if parsed.username or parsed.password or "@" in parsed.netloc:
        raise InputError(
            f"{redacted(url)}: the URL has credentials in it; they would be recorded in the plan and the manifest. "
            "Give them the usual way instead: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE in the "
            "environment (GOOGLE_APPLICATION_CREDENTIALS for gs://), and AWS_ENDPOINT_URL for an S3-compatible store"
        )


def filesystem(url: str) -> tuple[Any, str]:
    """fsspec's filesystem for ``url`` and the path within it; a missing package names its ``pip install`` line."""
    check_no_credentials(url)
    try:
        import fsspec
    except ImportError:
        raise InputError(f"{url}: reading URLs needs fsspec and s3fs (pip install 'shardflow[s3]')") from None
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as exc:
        scheme = url.split("://", 1)[0]
        raise InputError(
            f"{url}: no fsspec filesystem for {scheme}:// is installed ({exc}); "
            "pip install 'shardflow[s3]' for s3://, gcsfs for gs://"
        ) from None
    except ValueError as exc:
        raise InputError(f"{url}: not a usable fsspec URL ({exc})") from None
