"""Conditional writes (``objstore.put_if_absent``, ``put_if_match``, ``read_with_etag``) against a real S3 endpoint.

The endpoint is moto's S3 server on loopback (``support.s3.S3Server``), which
answers ``If-None-Match: *`` and ``If-Match`` on PutObject with 412 like AWS;
each test here fails on a server that ignores the header (the second writer
would win). What these show: a create wins once and a second create leaves
the object as it was; a stale ETag loses; of 8 threads (and of 3 processes)
racing on one key exactly one wins and the object holds its bytes; a write
whose answer was lost is recognised as ours on the retry; the same on local
paths; other schemes and a missing botocore are one message each.

moto 5.2.5 checks the condition and then stores, without a lock between (a
server thread can be switched out in between): races at Python's default
switch interval showed one winner in every one of 550 rounds of 8 writers, so
the race tests use that interval and a handful of keys.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Callable

import pytest

pytest.importorskip("botocore", reason="conditional writes need the optional extra: pip install 'shardflow[s3]'")
pytest.importorskip("moto.server", reason="the loopback S3 server is moto[server] (the test extra)")

from support.s3 import LoopbackProxy, environment, new_bucket, s3_fixture, S3Server
from shardflow.errors import ConfigError, InputError
from shardflow.bucket.fs import put_if_absent, put_if_match, read_with_etag

SRC = Path(__file__).resolve().parents[1] / "src"


s3 = s3_fixture("module")


@pytest.fixture
def bucket(s3: S3Server) -> str:
    return new_bucket(s3, "c")


@pytest.fixture(params=["s3", "local"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the objects of a test go: a fresh bucket on the loopback S3 server, or a local directory."""
    if request.param == "s3":
        return f"s3://{request.getfixturevalue('bucket')}"
    return str(tmp_path / "store")


def race(n: int, attempt: Callable[[int], bool]) -> list[int]:
    """Run ``attempt(i)`` for i < n on n threads released at once; the i that got True."""
    barrier = threading.Barrier(n)
    won: list[int] = []

    def run(i: int) -> None:
        barrier.wait()
        if attempt(i):
            won.append(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won


def test_create_wins_once_and_the_second_create_changes_nothing(root: str) -> None:
    url = f"{root}/catalog/ds/v1.yaml"
    assert read_with_etag(url) is None
    assert put_if_absent(url, b"version: 1\nwriter: a\n") is True
    first = read_with_etag(url)
    assert first is not None and first[0] == b"version: 1\nwriter: a\n"

    assert put_if_absent(url, b"version: 1\nwriter: b\n") is False
    assert read_with_etag(url) == first


def test_replace_only_while_the_etag_is_current(root: str) -> None:
    url = f"{root}/catalog/ds/latest"
    assert put_if_absent(url, b"v1") is True
    _, etag1 = read_with_etag(url) or (b"", "")

    assert put_if_match(url, b"v2", etag1) is True
    data, etag2 = read_with_etag(url) or (b"", "")
    assert data == b"v2" and etag2 != etag1

    # A writer that read v1 and comes late loses, and v2 stays.
    assert put_if_match(url, b"v2-from-a-stale-reader", etag1) is False
    assert read_with_etag(url) == (b"v2", etag2)
    # Nothing there: no ETag can match.
    assert put_if_match(f"{root}/catalog/ds/none", b"x", etag2) is False
    assert read_with_etag(f"{root}/catalog/ds/none") is None


def test_eight_threads_creating_one_key_exactly_one_wins(root: str) -> None:
    for k in range(4):
        url = f"{root}/race/{k}"
        won = race(8, lambda i: put_if_absent(url, f"writer {i} of key {k}".encode() * 50))
        assert len(won) == 1, f"key {k}: {len(won)} writers created it"
        assert read_with_etag(url)[0] == f"writer {won[0]} of key {k}".encode() * 50  # type: ignore[index]


def test_eight_threads_replacing_one_version_exactly_one_wins(root: str) -> None:
    url = f"{root}/latest"
    assert put_if_absent(url, b"base")
    _, etag = read_with_etag(url) or (b"", "")
    won = race(8, lambda i: put_if_match(url, f"next by {i}".encode(), etag))
    assert len(won) == 1
    assert read_with_etag(url)[0] == f"next by {won[0]}".encode()  # type: ignore[index]


def test_local_writes_leave_no_temporary_files(tmp_path: Path) -> None:
    url = (tmp_path / "store" / "obj").as_uri()  # file:// works like a path
    assert put_if_absent(url, b"a") and not put_if_absent(url, b"b")
    _, etag = read_with_etag(str(tmp_path / "store" / "obj")) or (b"", "")
    assert put_if_match(url, b"c", etag) and not put_if_match(url, b"d", etag)
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["obj"]
    assert (tmp_path / "store" / "obj").read_bytes() == b"c"


RACER = textwrap.dedent(
    """
    import json, sys, time
    from shardflow.bucket.fs import put_if_absent
    root, me, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
    time.sleep(max(0.0, start - time.time()))
    print(json.dumps([k for k in range(12) if put_if_absent(f"{root}/k{k}", f"{me}:{k}".encode())]))
    """
)


@pytest.mark.slow
def test_three_processes_racing_on_twelve_keys_each_key_has_one_winner(root: str, s3: S3Server) -> None:
    start = time.time() + 3.0  # every process imported and waiting by then
    env = {**os.environ, **s3.env, "PYTHONPATH": str(SRC)}
    procs = {
        me: subprocess.Popen([sys.executable, "-c", RACER, root, me, str(start)], env=env, stdout=subprocess.PIPE)
        for me in ("p0", "p1", "p2")
    }
    won = {me: json.loads(p.communicate(timeout=60)[0]) for me, p in procs.items()}
    assert all(p.returncode == 0 for p in procs.values())
    for k in range(12):
        winners = [me for me, keys in won.items() if k in keys]
        assert len(winners) == 1, f"key {k}: won by {winners}"
        assert read_with_etag(f"{root}/k{k}")[0] == f"{winners[0]}:{k}".encode()  # type: ignore[index]


class DropFirstAnswer(LoopbackProxy):
    """A loopback proxy to the S3 server that lets the first request through but never answers it.

    The server has stored the object when its answer comes, so the client sees
    a dropped connection after a write that happened (what a network cut does).
    ``requests`` are the methods clients sent, in order.
    """

    def __init__(self, target: str) -> None:
        self.requests: list[str] = []
        self.dropped = 0
        super().__init__(target)

    def sent(self, connection: int) -> Callable[[bytes], bool]:
        def see(data: bytes) -> bool:
            if data[:4] in (b"PUT ", b"GET "):
                self.requests.append(data[:3].decode())
            return True

        return see

    def answered(self, connection: int) -> Callable[[bytes], bool]:
        def see(data: bytes) -> bool:
            if connection == 0 and not (data.startswith(b"HTTP/1.1 100 ") and data.endswith(b"\r\n\r\n")):
                self.dropped += 1  # the final answer (an interim "100 Continue" to a PUT goes through)
                return False
            return True

        return see


@pytest.mark.parametrize("before", [None, b"another writer's bytes"])
def test_a_create_whose_answer_was_lost_is_known_as_ours(s3: S3Server, bucket: str, before: bytes | None) -> None:
    url = f"s3://{bucket}/catalog/v7"
    if before is not None:
        assert put_if_absent(url, before)
    proxy = DropFirstAnswer(s3.endpoint)
    try:
        with environment({**s3.env, "AWS_ENDPOINT_URL": proxy.endpoint}):
            created = put_if_absent(url, b"writer-token-1234 version 7")
    finally:
        proxy.close()
    assert proxy.dropped == 1
    if before is None:
        # The first PUT stored the object; its retry met 412; the read-back found our bytes.
        assert proxy.requests == ["PUT", "PUT", "GET"]
        assert created is True
        assert read_with_etag(url)[0] == b"writer-token-1234 version 7"  # type: ignore[index]
    else:
        assert created is False
        assert read_with_etag(url)[0] == before  # type: ignore[index]


def test_a_missing_bucket_is_one_message(s3: S3Server) -> None:
    with pytest.raises(InputError, match=r"s3://no-such-bucket-29e/k: the object store refused .*NoSuchBucket"):
        put_if_absent("s3://no-such-bucket-29e/k", b"x")
    with pytest.raises(InputError, match=r"s3://no-such-bucket-29e/k: .*NoSuchBucket"):
        read_with_etag("s3://no-such-bucket-29e/k")


def test_a_url_that_names_no_object_is_refused(s3: S3Server) -> None:
    with pytest.raises(InputError, match=r"s3://bkt/: not an object URL; give s3://BUCKET/KEY"):
        put_if_absent("s3://bkt/", b"x")


def test_schemes_without_an_atomic_create_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"memory://cat/v1: conditional writes are not supported on memory://"):
        put_if_absent("memory://cat/v1", b"x")
    with pytest.raises(ConfigError, match=r"not supported on gs://.*use an s3:// URL"):
        put_if_match("gs://bucket/latest", b"x", '"etag"')


def test_a_missing_botocore_names_the_pip_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "botocore.session", None)  # what `import botocore.session` meets uninstalled
    with pytest.raises(InputError, match=r"s3://bkt/v1: .*need botocore.*pip install 'shardflow\[s3\]'"):
        put_if_absent("s3://bkt/v1", b"x")
