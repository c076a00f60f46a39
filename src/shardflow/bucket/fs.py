"""URLs on object storage, as every part of shardflow reads them: which paths are URLs, and fsspec's filesystem.

One rule for the build's inputs (``sources/storage.py``) and the runtime's
versions (``runtime/remote_store.py``), here because the training runtime must not
import pyarrow (``sources`` does): a URL is anything ``scheme://`` but
``file://``; endpoints and credentials come from the environment
(``AWS_*``, ``AWS_ENDPOINT_URL``), never from the URL; a missing fsspec or
s3fs names ``pip install 'shardflow[s3]'``.

Conditional writes, the primitive of a publish that two writers cannot both
win: ``put_if_absent`` (S3 ``If-None-Match: *``), ``put_if_match`` (S3
``If-Match: <etag>``) and ``read_with_etag``. On ``s3://`` they go through
botocore's client (s3fs's dependency); on local paths and ``file://`` a hard
link and a directory lock give the same guarantees; other schemes are refused.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable
from urllib.parse import unquote, urlparse

from ..errors import CatalogError, ConfigError, InputError, network_unreachable

__all__ = ["is_remote", "check_no_credentials", "filesystem", "redacted"]
__all__ += ["put_if_absent", "put_if_match", "read_with_etag", "update_object", "refusing", "refused", "error_code"]

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


# --- conditional writes ------------------------------------------------------------------------------------------

_ATTEMPTS = 5  # per conditional request; network errors, 5xx and S3's 409 ConditionalRequestConflict are retried
_CLIENT_LOCK = threading.Lock()  # botocore sessions are not thread-safe; the clients they make are


@functools.lru_cache(maxsize=8)
def _client(env: tuple[str | None, ...]) -> Any:
    """An S3 client for the environment ``env`` (endpoint, keys, region), without botocore's own retries:
    after a request whose answer was lost, a 412 may be our own first attempt, which only ``_s3_put`` knows."""
    import botocore.config
    import botocore.session

    with _CLIENT_LOCK:
        config = botocore.config.Config(retries={"total_max_attempts": 1, "mode": "standard"})
        return botocore.session.get_session().create_client("s3", config=config)


def _s3_client(url: str) -> tuple[Any, str, str]:
    """(client, bucket, key) for an ``s3://bucket/key`` URL; a missing botocore names the pip line."""
    try:
        import botocore.session  # noqa: F401  (here for the message; _client uses it)
    except ImportError:
        raise InputError(
            f"{redacted(url)}: conditional writes to object storage need botocore (installed with s3fs): "
            "pip install 'shardflow[s3]'"
        ) from None
    parsed = urlparse(url)
    bucket, key = parsed.netloc, unquote(parsed.path.lstrip("/"))
    if not bucket or not key or key.endswith("/"):
        raise InputError(f"{redacted(url)}: not an object URL; give s3://BUCKET/KEY")
    env_keys = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_DEFAULT_REGION")
    return _client(tuple(os.environ.get(k) for k in env_keys)), bucket, key


def _scheme(url: str) -> str:
    """``s3`` or ``local``; any other scheme is refused with the schemes that work."""
    check_no_credentials(url)
    if not is_remote(url):
        return "local"
    scheme = url.split("://", 1)[0].lower()
    if scheme != "s3":
        raise ConfigError(
            f"{redacted(url)}: conditional writes are not supported on {scheme}:// (no atomic create-if-absent "
            "through fsspec there); use an s3:// URL (AWS S3, MinIO, R2, ... via AWS_ENDPOINT_URL) or a local path"
        )
    return scheme


def error_code(exc: Exception) -> tuple[str, int]:
    """The S3 error code and HTTP status of a botocore ClientError (``("", 0)`` for anything else)."""
    response = getattr(exc, "response", None) or {}
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return str(response.get("Error", {}).get("Code", "")), int(status)


def refused(url: str, exc: Exception) -> InputError:
    """One message for a request the store refused for good (no bucket, access denied, ...)."""
    code, _ = error_code(exc)
    return InputError(f"{redacted(url)}: the object store refused the request ({code}: {str(exc).split(': ', 1)[-1]})")


def _s3_put(url: str, data: bytes, condition: dict[str, Any]) -> bool:
    """PutObject with ``condition`` (and any other PutObject parameters); False when S3 answers 412 (or 404 to If-Match), True when written.

    A request whose answer was lost (connection dropped, 5xx) may have been written; if a retry then meets 412,
    an object holding exactly ``data`` is our write (writers that must tell equal bytes apart add a unique token).
    """
    client, bucket, key = _s3_client(url)
    maybe_written, attempt = False, 0
    while True:
        try:
            client.put_object(Bucket=bucket, Key=key, Body=data, **condition)
            return True
        except Exception as exc:  # botocore's ClientError and its network errors; the rest re-raised below
            code, status = error_code(exc)
            if status == 412 or (status == 404 and code == "NoSuchKey" and "IfMatch" in condition):
                return maybe_written and (got := read_with_etag(url)) is not None and got[0] == data
            if not (status >= 500 or status == 409 or code == "SlowDown" or (not status and network_unreachable(exc))):
                if status:
                    raise refused(url, exc) from None
                raise
            if attempt == _ATTEMPTS - 1:
                raise OSError(errno.EIO, f"{redacted(url)}: the object store kept failing ({code or exc})") from exc
            maybe_written = maybe_written or status != 409  # 409: a concurrent write; ours did not happen
            time.sleep(min(0.1 * 2**attempt, 2.0))
            attempt += 1


def _local_path(url: str) -> Path:
    """The path of a local path or ``file://`` URL."""
    return Path(unquote(urlparse(url).path)) if url.lower().startswith("file://") else Path(url)


def _staged(path: Path, data: bytes) -> Path:
    """``data`` in a new uniquely named ``.tmp`` file beside ``path``, flushed to disk."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def put_if_absent(url: str, data: bytes, *, metadata: dict[str, str] | None = None) -> bool:
    """Create the object at ``url`` holding ``data`` if none is there: True if created, False if one exists.

    Of concurrent callers on one key exactly one gets True, and the object
    holds its bytes, whole (S3 ``If-None-Match: *``; locally a hard link of a
    finished ``.tmp`` file, which fails if the name exists). ``metadata``: the
    S3 object's user metadata (a local file has none).
    """
    if _scheme(url) == "s3":
        return _s3_put(url, data, {"IfNoneMatch": "*", **({"Metadata": metadata} if metadata else {})})
    path = _local_path(url)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _staged(path, data)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def put_if_match(url: str, data: bytes, etag: str) -> bool:
    """Replace the object at ``url`` with ``data`` only if its ETag is still ``etag`` (from ``read_with_etag``).

    False if it changed or is gone. Locally, writers of one directory take turns
    under a lock on the directory; the replacement is a ``.tmp`` file renamed over the old one.
    """
    if _scheme(url) == "s3":
        return _s3_put(url, data, {"IfMatch": etag})
    import fcntl  # here, not at the top: the training runtime imports this module, also where fcntl is missing

    path = _local_path(url)
    if not path.parent.is_dir():
        return False
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released when fd is closed
        current = read_with_etag(url)
        if current is None or current[1] != etag:
            return False
        os.replace(_staged(path, data), path)
        return True
    finally:
        os.close(fd)


def read_with_etag(url: str) -> tuple[bytes, str] | None:
    """The object's bytes and its ETag (one version, read in one request), or None if there is no object."""
    if _scheme(url) == "s3":
        client, bucket, key = _s3_client(url)
        try:
            response = client.get_object(Bucket=bucket, Key=key)
        except Exception as exc:  # botocore's ClientError; network errors go on as they are
            code, status = error_code(exc)
            if code == "NoSuchKey":
                return None
            if 400 <= status < 500:
                raise refused(url, exc) from None
            raise
        return response["Body"].read(), response["ETag"]
    try:
        data = _local_path(url).read_bytes()  # one open: a concurrent os.replace swaps the whole file
    except FileNotFoundError:
        return None
    return data, '"' + hashlib.md5(data, usedforsecurity=False).hexdigest() + '"'  # S3's single-part ETag


def refusing(url: str, call: Any, *args: Any, **kwargs: Any) -> Any:
    """``call(...)``; a request the store refuses for good (4xx: no bucket, access denied) as one message naming ``url``."""
    try:
        return call(*args, **kwargs)
    except Exception as exc:  # botocore's ClientError; its network errors and the rest go on as they are
        if 400 <= error_code(exc)[1] < 500:
            raise refused(url, exc) from None
        raise


UPDATE_ATTEMPTS = 20  # conditional writes lost to other writers before giving up


def update_object(url: str, change: Callable[[bytes | None], bytes | None], *, again: str) -> bool:
    """Read, change and write back the object at ``url``, retried whenever another writer got in between.

    ``change(current)`` (``None``: no object) gives the new bytes, or None to leave the object as it is (then
    False is returned). The write is conditional (``put_if_match`` on the ETag read, ``put_if_absent`` where there
    was none), so no writer's change is lost. ``again``: what the message says to do after too many losses.
    """
    for _ in range(UPDATE_ATTEMPTS):
        got = read_with_etag(url)
        data = change(got[0] if got else None)
        if data is None:
            return False
        if put_if_match(url, data, got[1]) if got else put_if_absent(url, data):
            return True
    raise CatalogError(f"{url}: changed by other writers {UPDATE_ATTEMPTS} times in a row; {again}")
