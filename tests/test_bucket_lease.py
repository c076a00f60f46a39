"""The build lease (``shardflow.bucket.lease``) against a real S3 endpoint (moto's server on loopback).

What these show: a lease is created where ``lease_key`` says, and while it is live a second build's ``acquire``
gets None and ``wait_for_lease`` (with a timeout) raises ``LeaseHeld`` naming the holder; the renewing thread
moves ``expires_at`` on; an expired lease (a holder that died: a record no one renews) is taken over, and of
racing takers (2 on an expired lease, 4 on an absent one) exactly one wins; release deletes the lease, but not
one another build took over, and the build that lost it knows (``lost``, ``check()``); ``wait_for_lease`` returns
the version the holder published, or the lease once the holder dies, also when the holder's clock runs far
ahead. Small ttls keep it fast.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any, Callable

import pytest

pytest.importorskip("botocore", reason="conditional writes need the optional extra: pip install 'shardflow[s3]'")
pytest.importorskip("moto.server", reason="the loopback S3 server is moto[server] (the test extra)")

from support.s3 import S3Server, new_bucket, s3_fixture
from shardflow.bucket.fs import put_if_absent, read_with_etag
from shardflow.bucket.layout import BucketTarget, bucket_target
from shardflow.bucket.lease import (
    TTL_ENV, Lease, LeaseHeld, LeaseLost, LeaseRecord, default_ttl, lease_key, wait_for_lease,
)
from shardflow.errors import ConfigError

s3 = s3_fixture("module")
KEY = "0123456789abcdef" * 4


@pytest.fixture(scope="module")
def bucket(s3: S3Server) -> str:
    return new_bucket(s3, "lease")


@pytest.fixture
def target(bucket: str) -> BucketTarget:
    """A data root of its own for each test (one bucket for all: making one takes a while)."""
    data = f"data-{uuid.uuid4().hex[:8]}"
    return bucket_target(f"s3://{bucket}/{data}", f"s3://{bucket}/catalog")


def stored(target: BucketTarget, name: str = "ds", build_key: str = KEY) -> tuple[LeaseRecord, str] | None:
    got = read_with_etag(target.url(lease_key(target, name, build_key)))
    if got is None:
        return None
    record = LeaseRecord.parse(got[0])
    assert record is not None
    return record, got[1]


def dead_holder(target: BucketTarget, *, expires_in: float, ttl: float = 1.0, name: str = "ds",
                build_key: str = KEY) -> LeaseRecord:
    """The record of a holder that died (no one renews it), expiring ``expires_in`` seconds from now."""
    now = time.time()
    record = LeaseRecord(name=name, build_key=build_key, host="dead-host", pid=4242, token="deadbeef",
                         acquired_at=now - 100, expires_at=now + expires_in, ttl=ttl)
    assert put_if_absent(target.url(lease_key(target, name, build_key)), record.to_bytes())
    return record


def race(n: int, attempt: Callable[[], Lease | None]) -> tuple[list[Lease], int]:
    """``attempt()`` on n threads released at once: the leases taken, and how many found it held (None)."""
    barrier, won, held = threading.Barrier(n), list[Lease](), list[None]()

    def run() -> None:
        barrier.wait()
        if (lease := attempt()) is None:
            held.append(None)
        else:
            won.append(lease)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won, len(held)


def holder(target: BucketTarget, name: str = "ds", build_key: str = KEY) -> LeaseHeld:
    """What a second build meets: ``LeaseHeld``, naming the holder (``wait_for_lease`` with no time to wait)."""
    with pytest.raises(LeaseHeld) as held:
        wait_for_lease(target, name, build_key, done=lambda: None, timeout=0)
    return held.value


def acquired(target: BucketTarget, name: str = "ds", build_key: str = KEY, **kwargs: Any) -> Lease:
    lease = Lease.acquire(target, name, build_key, **kwargs)
    assert lease is not None, "the lease is held"
    return lease


def test_the_key_of_a_lease_and_the_names_it_refuses() -> None:
    target = BucketTarget(scheme="s3", bucket="b", data_key="data/x", catalog_key="catalog")
    assert lease_key(target, "ds", "abc") == "data/x/ds/.leases/abc.json"
    at_root = BucketTarget(scheme="s3", bucket="b", data_key="", catalog_key="")
    assert lease_key(at_root, "ds", "k") == "ds/.leases/k.json"
    for name, build_key in (("ds", "../x"), ("ds", ""), ("a/b", "k"), (".ds", "k")):
        with pytest.raises(ConfigError, match="lease key"):
            lease_key(target, name, build_key)


def test_the_ttl_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TTL_ENV, raising=False)
    assert default_ttl() == 60.0
    monkeypatch.setenv(TTL_ENV, "2.5")
    assert default_ttl() == 2.5
    for bad in ("0", "-1", "soon", "inf", "nan"):
        monkeypatch.setenv(TTL_ENV, bad)
        with pytest.raises(ConfigError, match=TTL_ENV):
            default_ttl()


def test_acquire_creates_the_lease_and_a_second_build_meets_its_holder(target: BucketTarget) -> None:
    with acquired(target, ttl=30) as lease:
        record, etag = stored(target) or pytest.fail("no lease object")
        assert record == lease.record and lease.took_over is None
        assert (record.name, record.build_key, record.renewals, record.ttl) == ("ds", KEY, 0, 30)
        assert 29 < record.expires_at - time.time() <= 30 and record.acquired_at <= time.time()
        assert Lease.acquire(target, "ds", KEY, ttl=30) is None
        held = holder(target)
        assert (held.record, held.etag) == (record, etag)
        assert f"host {record.host} (pid {record.pid}) since " in str(held)
        # Another build key, or another dataset, is another lease.
        with acquired(target, "ds", "other"), acquired(target, "ds2", KEY):
            pass
        lease.check()


def test_the_thread_renews_the_lease(target: BucketTarget) -> None:
    with acquired(target, ttl=0.9) as lease:
        first, _ = stored(target) or pytest.fail("no lease object")
        deadline = time.monotonic() + 5
        while (now := stored(target)) and now[0].renewals < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        record, _ = now or pytest.fail("lease gone")
        assert record.renewals >= 2 and record.expires_at > first.expires_at + 0.5
        assert record.acquired_at == first.acquired_at and record.token == first.token
        time.sleep(max(0.0, first.expires_at + 0.1 - time.time()))  # past the first ttl: live still, renewed
        lease.check()
        assert Lease.acquire(target, "ds", KEY, ttl=0.9) is None


def test_an_expired_lease_is_taken_over(target: BucketTarget) -> None:
    dead = dead_holder(target, expires_in=0.5)
    assert Lease.acquire(target, "ds", KEY, ttl=30) is None and holder(target).record == dead
    time.sleep(0.6)
    with acquired(target, ttl=30) as lease:
        assert lease.took_over == dead
        assert stored(target)[0].token == lease.record.token  # type: ignore[index]


def test_an_unreadable_lease_is_taken_over(target: BucketTarget) -> None:
    assert put_if_absent(target.url(lease_key(target, "ds", KEY)), b"not a lease")
    with acquired(target, ttl=30) as lease:
        assert lease.took_over is None and stored(target)[0] == lease.record  # type: ignore[index]


def test_two_builds_taking_over_one_expired_lease_exactly_one_wins(target: BucketTarget) -> None:
    for k in range(3):
        dead_holder(target, expires_in=-1, build_key=f"k{k}")
        won, held = race(2, lambda: Lease.acquire(target, "ds", f"k{k}", ttl=30))
        assert len(won) == 1 and held == 1, f"key k{k}: {len(won)} took it over"
        assert stored(target, build_key=f"k{k}")[0].token == won[0].record.token  # type: ignore[index]
        won[0].release()


def test_four_builds_acquiring_at_once_exactly_one_wins(target: BucketTarget) -> None:
    for k in range(3):
        won, held = race(4, lambda: Lease.acquire(target, "ds", f"k{k}", ttl=30))
        assert len(won) == 1 and held == 3, f"key k{k}: {len(won)} acquired it"
        assert stored(target, build_key=f"k{k}")[0].token == won[0].record.token  # type: ignore[index]
        won[0].release()


def test_release_deletes_the_lease_and_a_next_build_creates_it(target: BucketTarget) -> None:
    lease = acquired(target, ttl=30)
    lease.release()
    assert stored(target) is None and not lease.lost
    lease.release()  # twice: nothing more
    with acquired(target, ttl=30) as second:
        assert second.took_over is None
    assert stored(target) is None


def test_a_lease_taken_over_is_lost_and_its_release_leaves_the_new_holders(target: BucketTarget) -> None:
    first = acquired(target, ttl=30)
    # As wait_for_lease does after watching it unrenewed for a ttl (here: the first build stalled).
    _, etag = stored(target) or pytest.fail("no lease object")
    second = acquired(target, ttl=30, stale=etag)
    assert second.took_over == first.record
    assert first.renew() is False and first.lost
    with pytest.raises(LeaseLost, match=f"taken over by host .* \\(pid {second.record.pid}\\)"):
        first.check()
    first.release()
    assert stored(target)[0] == second.record  # type: ignore[index]
    second.release()
    assert stored(target) is None


def test_wait_for_lease_returns_the_version_the_holder_published(target: BucketTarget,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    published: list[str] = []
    first = acquired(target, ttl=30)

    def build() -> None:
        time.sleep(0.4)
        published.append("v3")
        first.release()

    builder = threading.Thread(target=build)
    builder.start()
    with caplog.at_level(logging.INFO, logger="shardflow.pipeline"):
        got = wait_for_lease(target, "ds", KEY, done=lambda: published[-1] if published else None, poll=0.05)
    builder.join()
    assert got == "v3"
    waits = [r.getMessage() for r in caplog.records if "waiting for the build" in r.getMessage()]
    assert len(waits) == 1 and f"host {first.record.host} (pid {first.record.pid})" in waits[0]


def test_wait_for_lease_takes_over_when_the_holder_dies(target: BucketTarget) -> None:
    dead = dead_holder(target, expires_in=0.5)
    started = time.monotonic()
    lease = wait_for_lease(target, "ds", KEY, done=lambda: None, poll=0.05, ttl=30)
    assert isinstance(lease, Lease) and lease.took_over == dead and time.monotonic() - started >= 0.4
    lease.release()


def test_wait_for_lease_takes_over_a_lease_unrenewed_for_a_ttl_whatever_its_clock(target: BucketTarget) -> None:
    dead = dead_holder(target, expires_in=3600, ttl=0.5)  # the dead holder's clock ran an hour ahead
    lease = wait_for_lease(target, "ds", KEY, done=lambda: None, poll=0.05, ttl=30, timeout=10)
    assert isinstance(lease, Lease) and lease.took_over == dead
    lease.release()


def test_wait_for_lease_gives_up_after_its_timeout(target: BucketTarget) -> None:
    with acquired(target, ttl=30) as first:
        started = time.monotonic()
        with pytest.raises(LeaseHeld, match="still after 0.2 s") as held:
            wait_for_lease(target, "ds", KEY, done=lambda: None, poll=0.05, timeout=0.2)
        assert held.value.record == first.record and 0.2 <= time.monotonic() - started < 5


def test_a_lease_taken_just_as_the_version_appears_is_released(target: BucketTarget) -> None:
    answers = iter([None, "v1"])  # published between the check and the acquire
    assert wait_for_lease(target, "ds", KEY, done=lambda: next(answers), poll=0.05, ttl=30) == "v1"
    assert stored(target) is None
