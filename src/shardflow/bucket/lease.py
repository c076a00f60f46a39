"""One build per build key on a bucket: a lease that a second build of the same key waits on, or takes over.

The lease of a dataset ``name`` and a ``build_key`` is the object ``<data-root>/<name>/.leases/<build_key>.json``
(``lease_key``), a JSON ``LeaseRecord``: the holder (host, pid, a random token), name, build key, ``acquired_at``,
``expires_at`` (UTC epoch seconds), ``ttl`` (seconds) and ``renewals``. ``Lease.acquire`` creates it with
``put_if_absent``, or takes an expired one over with ``put_if_match`` on the ETag it read, so of racing builds
exactly one holds it; a daemon thread renews it every ttl/3 with ``put_if_match``; ``release`` deletes it.
``wait_for_lease`` is the loop a second build runs: it returns the version the holder published, or the lease
once the holder is gone. A build that takes a lease over resumes from the jobs its predecessor committed
(``Lease.took_over`` says whose); it never redoes them.

Clocks. ``expires_at`` is the holder's wall clock; a taker compares it with its own, so the machines' clocks must
agree within a fraction of the ttl (NTP keeps them within milliseconds; the ttl is a minute). The store's
``LastModified`` would not do better: fs does not read it with the object, and it too would be compared with a
local clock. What each side does on its own clock keeps a disagreement from going unnoticed or blocking forever:

* a holder whose clock runs behind looks expired early and may be taken over; its next renewal then fails, it
  sets ``lost``, and ``check()`` raises, so it stops;
* a holder whose clock runs ahead would look live too long, so ``wait_for_lease`` also takes over a lease it has
  watched unchanged (one ETag) for a whole ttl on its monotonic clock, whatever ``expires_at`` says;
* a holder counts its own ttl on its monotonic clock from before each write: ``check()`` raises once a ttl has
  passed without a renewal stored (a network cut), which is before any waiter can have watched a ttl go by.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import re
import secrets
import socket
import threading
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable

from ..errors import CatalogError, ConfigError, ShardflowError
from .fs import filesystem, put_if_absent, put_if_match, read_with_etag, refusing
from .layout import BucketTarget

__all__ = ["LEASE_DIR", "TTL_ENV", "DEFAULT_TTL", "DEFAULT_POLL", "LeaseHeld", "LeaseLost", "LeaseRecord", "Lease",
           "lease_key", "default_ttl", "wait_for_lease", "check_held"]

log = logging.getLogger("shardflow.pipeline")

LEASE_DIR = ".leases"
TTL_ENV = "SHARDFLOW_LEASE_TTL"
DEFAULT_TTL = 60.0
DEFAULT_POLL = 5.0
_ATTEMPTS = 5  # conditional writes lost in a row in one acquire; each loss means another writer got in
_KEY_PART = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$")


class LeaseHeld(ShardflowError):
    """Another build holds the lease: ``record`` is its record, ``etag`` the ETag it was read with."""

    def __init__(self, message: str, record: LeaseRecord, etag: str) -> None:
        super().__init__(message)
        self.record, self.etag = record, etag


class LeaseLost(ShardflowError):
    """This build no longer holds its lease: it was taken over, or could not be renewed within its ttl."""


def lease_key(target: BucketTarget, name: str, build_key: str) -> str:
    """The bucket key of the lease of ``name`` and ``build_key``: ``<data-root>/<name>/.leases/<build_key>.json``."""
    for what, part in (("dataset name", name), ("build key", build_key)):
        if not _KEY_PART.match(part):
            raise ConfigError(f"{what} {part!r}: a lease key needs letters, digits, '.', '_' or '-', not first '.'")
    return "/".join(p for p in (target.data_key, name, LEASE_DIR, f"{build_key}.json") if p)


def default_ttl() -> float:
    """``$SHARDFLOW_LEASE_TTL`` (seconds, > 0), else ``DEFAULT_TTL``."""
    if not (text := os.environ.get(TTL_ENV, "").strip()):
        return DEFAULT_TTL
    ttl = float(text) if re.fullmatch(r"[0-9]*\.?[0-9]+(e[+-]?[0-9]+)?", text, re.I) else 0.0
    if not 0 < ttl < float("inf"):
        raise ConfigError(f"{TTL_ENV}={text!r}: give the lease's time to live in seconds, a number above 0 (e.g. 60)")
    return ttl


@dataclass(frozen=True, kw_only=True)
class LeaseRecord:
    """The body of a lease object: who holds it, for what, and until when (UTC epoch seconds)."""

    name: str
    build_key: str
    host: str
    pid: int
    token: str
    acquired_at: float
    expires_at: float
    ttl: float
    renewals: int = 0

    def to_bytes(self) -> bytes:
        body = asdict(self)
        holder = {k: body.pop(k) for k in ("host", "pid", "token")}
        return json.dumps({**body, "holder": holder}, sort_keys=True).encode()

    @classmethod
    def parse(cls, data: bytes) -> LeaseRecord | None:
        """The record in ``data``; None when it is not one (then it is taken as expired: no holder wrote it)."""
        try:
            body = json.loads(data)
            holder = body["holder"]
            return cls(name=str(body["name"]), build_key=str(body["build_key"]), host=str(holder["host"]),
                       pid=int(holder["pid"]), token=str(holder["token"]), acquired_at=float(body["acquired_at"]),
                       expires_at=float(body["expires_at"]), ttl=float(body["ttl"]),
                       renewals=int(body.get("renewals", 0)))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None

    def describe(self) -> str:
        """``host H (pid P) since <UTC time>``: the holder, as messages name it."""
        since = _dt.datetime.fromtimestamp(self.acquired_at, _dt.timezone.utc).replace(microsecond=0)
        return f"host {self.host} (pid {self.pid}) since {since.isoformat().replace('+00:00', 'Z')}"


class Lease:
    """The lease this process holds on one build key (take it with ``acquire``); a context manager that releases.

    ``lost``: it was taken over (a renewal found another holder's ETag). ``took_over``: the record of the expired
    holder it replaced, or None when there was none.
    """

    def __init__(self, target: BucketTarget, name: str, build_key: str, *, ttl: float | None = None) -> None:
        self.url = target.url(lease_key(target, name, build_key))
        self.ttl = default_ttl() if ttl is None else float(ttl)
        if not self.ttl > 0:
            raise ConfigError(f"lease ttl {ttl!r}: give seconds, above 0")
        now = time.time()
        self.record = LeaseRecord(name=name, build_key=build_key, host=socket.gethostname(), pid=os.getpid(),
                                  token=secrets.token_hex(8), acquired_at=now, expires_at=now + self.ttl, ttl=self.ttl)
        self.took_over: LeaseRecord | None = None
        self.taken_by: LeaseRecord | None = None
        self._etag = ""
        self._deadline = 0.0  # monotonic: when our last stored record expires, counted from before its write
        self.lost = self._released = False
        self._lock = threading.Lock()  # one conditional write at a time: the renewer's and release's
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.on_renew: list[Callable[[], None]] = []
        """Called after each renewal, on the renewing thread: what else the holder keeps alive with the lease."""

    @classmethod
    def acquire(cls, target: BucketTarget, name: str, build_key: str, *, ttl: float | None = None,
                stale: str | None = None) -> Lease | None:
        """Take the lease: create it, or take over an expired one; None while another build holds it.

        ``ttl``: seconds (``default_ttl()``). ``stale``: the ETag of a record the caller watched go unrenewed for a
        whole ttl, taken over as expired whatever its ``expires_at`` says (``wait_for_lease``). Starts the renewing
        thread. ``wait_for_lease(..., timeout=0)`` raises ``LeaseHeld`` naming the holder instead.
        """
        with contextlib.suppress(LeaseHeld):
            return cls._take(target, name, build_key, ttl, stale)
        return None

    @classmethod
    def _take(cls, target: BucketTarget, name: str, build_key: str, ttl: float | None, stale: str | None) -> Lease:
        """``acquire``, raising ``LeaseHeld`` (with the holder's record and ETag) while another build holds it."""
        lease = cls(target, name, build_key, ttl=ttl)
        for _ in range(_ATTEMPTS):
            got = read_with_etag(lease.url)
            current = LeaseRecord.parse(got[0]) if got else None
            if got and current is not None and current.expires_at >= time.time() and got[1] != stale:
                raise LeaseHeld(f"{name}: the build of build key {build_key[:16]} is running on "
                                f"{current.describe()} (lease {lease.url})", current, got[1])
            url = lease.url
            if lease._write(lambda b: put_if_match(url, b, got[1]) if got else put_if_absent(url, b), fresh=True):
                lease.took_over = current
                if current is not None:
                    log.info("%s: took over the expired lease of build key %s from %s", name, build_key[:16],
                             current.describe())
                lease._thread = threading.Thread(target=lease._renew_loop, name=f"lease-{build_key[:8]}", daemon=True)
                lease._thread.start()
                _HELD[lease.url] = lease
                return lease
        raise CatalogError(f"{lease.url}: changed by other builds {_ATTEMPTS} times in a row; run the build again")

    def _write(self, put: Callable[[bytes], bool], *, fresh: bool = False) -> bool:
        """Store the record renewed by one ttl with ``put``; True and the new ETag kept if it is ours."""
        now, started = time.time(), time.monotonic()
        record = replace(self.record, expires_at=now + self.ttl, renewals=0 if fresh else self.record.renewals + 1,
                         **({"acquired_at": now} if fresh else {}))
        body = record.to_bytes()  # unique: the token and the times are in it
        if not put(body):
            return False
        # put_* give no ETag: read it back. No one else may write it now: it is live for a ttl.
        got = read_with_etag(self.url)
        if got is None or got[0] != body:
            return False
        self.record, self._etag, self._deadline = record, got[1], started + self.ttl
        return True

    def renew(self) -> bool:
        """Extend the lease by a ttl now (the thread does so every ttl/3); False, and ``lost`` set, if taken over."""
        with self._lock:
            if self.lost or self._released or not self._etag:
                return not self.lost
            if self._write(lambda body: put_if_match(self.url, body, self._etag)):
                return True
            self._mark_lost()
            return False

    def _mark_lost(self) -> None:
        self.lost = True
        got = read_with_etag(self.url)
        self.taken_by = LeaseRecord.parse(got[0]) if got else None
        log.warning("%s: lost the lease of build key %s to %s", self.record.name, self.record.build_key[:16],
                    self.taken_by.describe() if self.taken_by else "a release")

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                if not self.renew():
                    return
                for also in list(self.on_renew):
                    also()
            except Exception as exc:  # a network error: the next tick retries; check() tells when the ttl ran out
                log.warning("%s: could not renew the lease %s (%s); retrying", self.record.name, self.url, exc)

    def check(self) -> None:
        """Raise ``LeaseLost`` if this build no longer holds the lease (call it before committing work)."""
        what = f"{self.record.name}: the lease of build key {self.record.build_key[:16]} ({self.url})"
        if self.lost:
            by = self.taken_by.describe() if self.taken_by else "another build"
            raise LeaseLost(f"{what} was taken over by {by} after this build stalled past its ttl ({self.ttl:g} s) "
                            "(or its clock ran behind); stop here: that build goes on from the committed jobs")
        if not self._released and time.monotonic() > self._deadline:
            raise LeaseLost(f"{what} could not be renewed for its ttl ({self.ttl:g} s), so another build may take it "
                            "over; stop here and run the build again: committed jobs are reused")

    def release(self) -> None:
        """Stop renewing and delete the lease, unless another build took it over (then it is left to that one)."""
        self._stop.set()
        _HELD.pop(self.url, None)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with self._lock:
            if self.lost or self._released or not self._etag:
                return
            self._released = True
            try:
                # Renewed first, conditionally: if that lands, the lease is ours and live for a ttl, so no one can
                # take it over before the (unconditional) delete just after; fs has no delete-if-match.
                if not self._write(lambda body: put_if_match(self.url, body, self._etag)):
                    self._mark_lost()
                    return
                fs, path = filesystem(self.url)
                with contextlib.suppress(FileNotFoundError):
                    refusing(self.url, fs.rm_file, path)
            except Exception as exc:  # release runs in __exit__: it must not hide the build's own error
                log.warning("%s: could not delete the lease %s (%s); it expires by itself within %g s",
                            self.record.name, self.url, exc, self.ttl)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: Any) -> None:  # released also when the build failed: a waiter takes over at once
        self.release()


_HELD: dict[str, Lease] = {}  # the leases this process holds, by URL


def check_held(target: BucketTarget, name: str, build_key: str) -> None:
    """``Lease.check()`` of the lease this process holds for ``build_key``, if it holds one (before committing)."""
    lease = _HELD.get(target.url(lease_key(target, name, build_key)))
    if lease is not None:
        lease.check()


def wait_for_lease(target: BucketTarget, name: str, build_key: str, *, done: Callable[[], str | None],
                   poll: float | None = None, timeout: float | None = None, ttl: float | None = None) -> str | Lease:
    """Wait for the build that holds the lease: the version it published, or the lease once the holder is gone.

    Polls every ``poll`` seconds (``DEFAULT_POLL``): ``done()`` gives the published version (or None); else
    ``Lease.acquire``. A lease unchanged for a whole ttl on this machine's monotonic clock is taken over however
    far its ``expires_at`` is (the module docstring). Logs once, at INFO, whose build it waits for. ``timeout``
    (seconds): raise ``LeaseHeld`` after it (0: at once). A lease taken when ``done()`` then reports a version is
    released. ``ttl``: that of the lease it takes.
    """
    poll = DEFAULT_POLL if poll is None else poll
    started, logged = time.monotonic(), False
    seen, seen_at, stale = "", 0.0, None
    while True:
        if version := done():
            return version
        try:
            lease = Lease._take(target, name, build_key, ttl, stale)
        except LeaseHeld as held:
            now = time.monotonic()
            if held.etag != seen:
                seen, seen_at = held.etag, now
            stale = seen if now - seen_at > held.record.ttl else None
            if not logged:
                log.info("%s: waiting for the build of build key %s held by %s", name, build_key[:16],
                         held.record.describe())
                logged = True
            if timeout is not None and now - started >= timeout:
                raise LeaseHeld(f"{held}; still after {timeout:g} s of waiting", held.record, held.etag) from None
            if stale is None:  # a stale lease is taken over at once, not a poll later
                time.sleep(poll)
            continue
        # The holder may have published and released between done() and acquire: never build it twice.
        if version := done():
            lease.release()
            return version
        return lease
