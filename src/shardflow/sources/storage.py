"""Inputs on object storage, read in place: listing, identity, opening, and one message per failure.

A source given as an fsspec URL (``s3://bucket/prefix/``, ``gs://...``,
``memory://...`` in tests) is never copied anywhere. Planning lists it and
takes from the listing what the storage already knows about each object: its
size and its identity (version id or ETag, see ``identity``), so the work that
grows with the corpus on the planning machine is one LIST page per thousand
objects plus a few ranged reads per object (a Parquet footer, the head of a
JSON Lines object), never its bytes. The workers then open the objects they
read themselves (``open_input``), with ranged reads, and hash them
(``hash_input``) for the manifest.

Endpoints and credentials come the usual way: ``AWS_ENDPOINT_URL`` (or
fsspec's ``FSSPEC_S3_ENDPOINT_URL``) for S3-compatible stores (MinIO, Ceph,
R2, a test server), and the environment or a profile for keys. A URL with
credentials in it (``s3://KEY:SECRET@bucket/``) is refused: they would end up
in the plan, the manifest and the logs.

``file://`` URLs and plain paths are local files: opened with ``open``, as
before; nothing here changes them.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any, BinaryIO, NoReturn
from urllib.parse import unquote, urlparse

from ..errors import InputError, missing_credentials
from ..bucket.fs import check_no_credentials, filesystem, is_remote

__all__ = [
    "is_remote",
    "local_path",
    "check_no_credentials",
    "list_objects",
    "identity",
    "open_input",
    "hash_input",
    "hashing_reads",
    "claim_hash",
    "hashing",
    "ReadHash",
    "current_identity",
    "read_head",
    "storage_error",
    "PLAN_BLOCK",
    "READ_BLOCK",
]


PLAN_BLOCK = 1 << 16
"""Read-ahead of the files planning opens: a footer or a head costs one small ranged read, not 5 MiB."""
READ_BLOCK = 8 << 20
"""Read-ahead of the files workers read through: few requests per unit, bounded memory."""

# Keys of fsspec's info() that identify one version of an object, most specific first:
# S3 version ids and GCS generations never repeat; an ETag changes with the content;
# the times are what filesystems without either (memory://) offer.
_IDENTITY_KEYS = ("VersionId", "version_id", "generation", "ETag", "etag", "md5Hash", "checksum", "mtime", "LastModified", "created")


def local_path(spec: str) -> str:
    """A ``file://`` URL as the local path it names; anything else as it is."""
    if not spec.lower().startswith("file://"):
        return spec
    parsed = urlparse(spec)
    if parsed.netloc not in ("", "localhost"):
        raise InputError(f"{spec}: file:// URLs must name a local path (file:///path), not host {parsed.netloc!r}")
    return unquote(parsed.path)


def storage_error(where: str, exc: BaseException, *, listing: bool = False) -> InputError | None:
    """The one message for a storage failure (missing, denied), or None if ``exc`` is not one.

    ``listing``: the failure is the listing's (the URL names nothing), not a planned object's (it went away).
    """
    detail = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, FileNotFoundError) and listing:
        return InputError(f"{where}: no such bucket or object ({detail}); check the URL")
    if isinstance(exc, FileNotFoundError):
        return InputError(
            f"{where}: no such bucket or object ({detail}); it was listed when the build was planned, so it was "
            "deleted since: restore it, or build again without it"
        )
    if missing_credentials(exc):  # botocore's, not an OSError
        return InputError(
            f"{where}: no usable credentials for the object store ({detail}); set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY or AWS_PROFILE (and AWS_ENDPOINT_URL for an S3-compatible store)"
        )
    if isinstance(exc, PermissionError):
        return InputError(
            f"{where}: access denied ({detail}); check the credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY "
            "or AWS_PROFILE) and that they may list and read this bucket"
        )
    return None


def _raise_storage_error(where: str, exc: Exception, *, listing: bool = False) -> NoReturn:
    """Raise :func:`storage_error`'s message for ``exc``, or ``exc`` itself (a bug, or a transient error to retry)."""
    error = storage_error(where, exc, listing=listing)
    if error is None:
        raise exc
    raise error from None


def identity(info: dict[str, Any], like: str = "") -> str:
    """The storage's identity of one version of an object (``"ETag=..."``), or ``""`` if it reports none.

    ``like``: an identity recorded before; the same kind is given if ``info`` has it. A listing and a
    HEAD of one object may report different kinds (S3's listing has no ``VersionId``, its HEAD has one
    on a versioned bucket): compared across kinds, an unchanged object would look changed.
    """
    kind = like.partition("=")[0]
    for key in ((kind,) if kind in _IDENTITY_KEYS and info.get(kind) not in (None, "") else _IDENTITY_KEYS):
        value = info.get(key)
        if value not in (None, ""):
            if hasattr(value, "timestamp"):  # a listing and a HEAD may give one time as a float and a datetime
                value = float(value.timestamp())
            return f"{key}={value}"
    return ""


def _is_glob(path: str) -> bool:
    return any(ch in path for ch in "*?[")


def glob_base(path: str) -> str:
    """The fixed directory prefix of a glob, up to and including its last '/' before a wildcard."""
    cut = min((i for i, ch in enumerate(path) if ch in "*?["), default=len(path))
    head = path[:cut]
    return head[: head.rfind("/") + 1]


def list_objects(spec: str, wanted: Any) -> list[tuple[str, str, int, str]]:
    """``(URL, relname, size, identity)`` of each object a URL names: one object, a prefix, or a glob.

    Relnames are what a local copy of the same tree gives (a file's name; the
    path under a directory or under a glob's fixed prefix), so the manifest and
    the held-out split are the same. ``wanted(name)`` says which objects under a
    prefix are inputs. One listing, no reads: O(objects).
    """
    check_no_credentials(spec)
    fs, root = filesystem(spec)
    protocol = spec.split("://", 1)[0]
    try:
        if _is_glob(root):
            base = glob_base(root)
            found = fs.glob(root, detail=True)
            infos = {p: i for p, i in sorted(found.items()) if i.get("type") == "file"}
            if not infos:
                raise InputError(f"{spec}: the pattern matches no objects; check the URL and the pattern")
            rel = {p: (p[len(base):] if p.startswith(base) else PurePosixPath(p).name).lstrip("/") for p in infos}
        else:
            root = root.rstrip("/")
            infos = {p: i for p, i in sorted(fs.find(root, detail=True).items()) if i.get("type") == "file"}
            if infos and list(infos) != [root]:  # a prefix (a "directory")
                rel = {p: p[len(root):].lstrip("/") for p in infos}
                rel = {p: r for p, r in rel.items() if wanted(r)}
                if not rel:
                    raise InputError(f"{spec}: the prefix holds no input files")
                infos = {p: infos[p] for p in rel}
            else:
                info = infos.get(root) or fs.info(root)
                if info.get("type") != "file":
                    raise InputError(f"{spec}: no such object or prefix; check the URL")
                infos, rel = {root: info}, {root: PurePosixPath(root).name}
    except InputError:
        raise
    except Exception as exc:
        _raise_storage_error(spec, exc, listing=True)
    out = []
    for p, info in infos.items():
        url = fs.unstrip_protocol(p) if hasattr(fs, "unstrip_protocol") else f"{protocol}://{p}"
        if url.split("://", 1)[0] != protocol:  # fsspec may name s3 as s3a, or memory with one slash
            url = f"{protocol}://{p.lstrip('/')}" if protocol != "memory" else f"memory://{p}"
        out.append((url, rel[p], int(info.get("size") or 0), identity(info)))
    return out


class _HashingReader:
    """A file object that hashes what is read through it, while the reads are in order from the start.

    A reader that seeks (Parquet's footer first) or stops early leaves no
    digest, and the object is hashed separately (``hash_input``).
    """

    def __init__(self, f: Any, tee: "ReadHash") -> None:
        self._f, self._tee = f, tee

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self._tee.update(data)
        return data  # type: ignore[no-any-return]

    def seek(self, pos: int, whence: int = 0) -> int:
        new = self._f.seek(pos, whence)
        if new != self._tee.pos:
            self._tee.broken = True
        return new  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)

    def __enter__(self) -> "_HashingReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._f.close()


class ReadHash:
    """The SHA-256 of an object as a worker reads it through ``open_input`` (see ``hashing_reads``)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.pos = 0
        self.broken = False
        self.opened = 0
        self.kept: tuple[int, bytes] | None = None
        """``(offset, bytes)``: the end of a local file that its reader read first (a Parquet footer), kept so that
        it is hashed at the end without reading it again (``sources/hashing.py``)."""
        self._h = hashlib.sha256()

    def update(self, data: bytes) -> None:
        self._h.update(data)
        self.pos += len(data)

    def digest(self, size: int) -> str | None:
        """The hex digest if the object was read, in order, from its first byte to its last through the first
        stream opened on it (``claim_hash``); else None."""
        if self.broken or not self.opened or self.pos != size:
            return None
        return self._h.hexdigest()


_tee: contextvars.ContextVar[ReadHash | None] = contextvars.ContextVar("shardflow_read_hash", default=None)


@contextlib.contextmanager
def hashing_reads(path: str) -> Iterator[ReadHash]:
    """Hash ``path`` as this context reads it: a reader that goes through it once spares a second read.

    A context variable, not a thread's: a reader run ahead on another thread in a copy of this context
    (``overlap.py``) hashes what it reads."""
    tee = ReadHash(path)
    token = _tee.set(tee)
    try:
        yield tee
    finally:
        _tee.reset(token)


def hashing(path: str) -> bool:
    """Whether this context hashes ``path`` as it reads it, and has opened no stream on it yet (see ``claim_hash``)."""
    tee = _tee.get()
    return tee is not None and tee.path == path and not tee.opened


def claim_hash(path: str) -> ReadHash | None:
    """The hash this context takes of ``path`` as it reads it (``hashing_reads``), for the first stream opened on it
    only; None for any other (a second stream would hash bytes out of order)."""
    tee = _tee.get()
    if tee is None or tee.path != path:
        return None
    tee.opened += 1
    return tee if tee.opened == 1 else None


def open_input(path: str, *, block_size: int = READ_BLOCK) -> BinaryIO:
    """A binary file object for a local path or a URL; for a URL, ranged reads of ``block_size``.

    Under ``hashing_reads(path)``, the first one opened hashes what is read through it, in order."""
    if not is_remote(path):
        f: Any = open(path, "rb")
    else:
        fs, root = filesystem(path)
        try:
            f = fs.open(root, "rb", block_size=block_size)
        except Exception as exc:
            _raise_storage_error(path, exc)
    tee = claim_hash(path)
    return f if tee is None else _HashingReader(f, tee)  # type: ignore[no-any-return, return-value]


def read_head(path: str, n: int) -> bytes:
    """The first ``n`` bytes of an object (or a local file): one ranged read, nothing read ahead."""
    if not is_remote(path):
        with open(path, "rb") as f:
            return f.read(n)
    fs, root = filesystem(path)
    try:
        return fs.cat_file(root, start=0, end=n)  # type: ignore[no-any-return]
    except Exception as exc:
        _raise_storage_error(path, exc)


def current_identity(path: str, like: str = "") -> tuple[int, str]:
    """``(size, identity)`` of the object as the storage reports it now (one HEAD request); the identity of the
    kind of ``like`` (see ``identity``)."""
    fs, root = filesystem(path)
    try:
        fs.invalidate_cache(root)
        info = fs.info(root)
    except Exception as exc:
        _raise_storage_error(path, exc)
    return int(info.get("size") or 0), identity(info, like)


def _chunks(f: BinaryIO) -> Iterator[bytes]:
    while block := f.read(READ_BLOCK):
        yield block


def hash_input(path: str) -> str:
    """SHA-256 of an input's bytes, streamed (run by the worker that reads the object, not by planning)."""
    h = hashlib.sha256()
    try:
        with open_input(path) as f:
            for block in _chunks(f):
                h.update(block)
    except Exception as exc:
        _raise_storage_error(path, exc)
    return h.hexdigest()
