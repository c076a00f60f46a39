"""A real S3 endpoint on loopback for the object-storage tests, and a proxy that sees what a process reads.

``S3Server`` is moto's standalone server (``moto[server]``, ``ThreadedMotoServer``)
on 127.0.0.1 and a random port: it speaks the S3 HTTP protocol, so s3fs and
botocore talk to it exactly as to AWS, MinIO or R2. Clients find it the
standard way: ``AWS_ENDPOINT_URL``, with dummy keys and region in the
environment (``env``), which spawned Dask workers inherit.

``CountingProxy`` (a ``LoopbackProxy``) forwards a loopback port to the server and records every
request (method, object, byte range) and the bytes the server sent back, so a
test can say how much of the corpus a process read, and of which objects.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import uuid
from contextlib import contextmanager
from typing import Any, Callable, Iterator


def clear_fs_cache() -> None:
    """Forget cached s3fs instances: they keep the endpoint and keys they were made with."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()


class S3Server:
    """moto's S3 server on loopback; ``env`` points clients at it."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.env = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
        }

    def stop(self) -> None:
        self._server.stop()

    def client_options(self) -> dict[str, str]:
        """``boto3.client("s3", **options)`` on this server (for what s3fs does not do: bucket settings)."""
        return dict(endpoint_url=self.endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                    region_name="us-east-1")

    def fs(self) -> Any:
        """An s3fs filesystem on this server (for putting, changing and deleting test objects)."""
        import s3fs

        return s3fs.S3FileSystem(endpoint_url=self.endpoint, key="testing", secret="testing", skip_instance_cache=True)


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the block, restoring the old values afterwards."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    clear_fs_cache()
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        clear_fs_cache()


def s3_fixture(scope: str = "module") -> Any:
    """A pytest fixture ``s3``: an ``S3Server`` for the ``scope``, its endpoint and keys in the environment meanwhile."""
    import pytest

    @pytest.fixture(scope=scope)
    def s3() -> Iterator[S3Server]:
        server = S3Server()
        with environment(server.env):
            yield server
        server.stop()

    return s3


def upload_tree(s3: S3Server, local: Any, url_root: str) -> None:
    """Every file under the local directory ``local`` (a staging directory's excepted) to ``url_root`` (``bucket/prefix``)."""
    fs = s3.fs()
    for p in sorted(local.rglob("*")):
        if p.is_file() and ".staging" not in p.parts:
            fs.put_file(str(p), f"{url_root}/{p.relative_to(local).as_posix()}")


def new_bucket(s3: S3Server, prefix: str) -> str:
    """A new, empty bucket on ``s3`` (a unique name starting ``prefix``)."""
    name = f"{prefix}-{uuid.uuid4().hex[:12]}"
    s3.fs().mkdir(name)
    return name


_REQUEST = re.compile(rb"(GET|HEAD|PUT|POST|DELETE) (\S+) HTTP/1\.1\r\n(.*?)\r\n\r\n", re.S)
_RANGE = re.compile(rb"\r\nrange: bytes=(\d+)-(\d+)", re.I)


class LoopbackProxy:
    """A TCP proxy on loopback in front of ``target`` (``http://HOST:PORT``); clients use ``endpoint``.

    Each connection's bytes go through ``sent(connection)`` (client to server) and ``answered(connection)``
    (server to client): callables made per connection (numbered from 0) that see each chunk and return
    whether to pass it on; False ends the connection.
    """

    def __init__(self, target: str) -> None:
        host, port = target.rsplit("//", 1)[1].split(":")
        self._to = (host, int(port))
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def sent(self, connection: int) -> Callable[[bytes], bool]:
        return lambda data: True

    def answered(self, connection: int) -> Callable[[bytes], bool]:
        return lambda data: True

    def _accept(self) -> None:
        connection = 0
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._to)
            for args in ((client, upstream, self.sent(connection)), (upstream, client, self.answered(connection))):
                threading.Thread(target=_pump, args=args, daemon=True).start()
            connection += 1

    def close(self) -> None:
        self._sock.close()


def _pump(src: socket.socket, dst: socket.socket, see: Callable[[bytes], bool]) -> None:
    try:
        while data := src.recv(1 << 16):
            if not see(data):
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class CountingProxy(LoopbackProxy):
    """A proxy in front of the S3 server that counts what clients asked for and received."""

    def __init__(self, target: str) -> None:
        self.received = 0
        self.sent_bytes = 0
        """Every byte clients sent (request heads and bodies: what they uploaded)."""
        self.requests: list[tuple[str, str, tuple[int, int] | None]] = []
        self._lock = threading.Lock()
        super().__init__(target)

    def sent(self, connection: int) -> Callable[[bytes], bool]:
        pending = b""

        def see(data: bytes) -> bool:
            nonlocal pending
            with self._lock:
                self.sent_bytes += len(data)
            pending = self._parse(pending + data)
            return True

        return see

    def answered(self, connection: int) -> Callable[[bytes], bool]:
        def see(data: bytes) -> bool:
            with self._lock:
                self.received += len(data)
            return True

        return see

    def _parse(self, data: bytes) -> bytes:
        """Record the complete request heads in ``data``; returns what is left (bodies of GETs are empty)."""
        end = 0
        for m in _REQUEST.finditer(data):
            rng = _RANGE.search(b"\r\n" + m.group(3))
            with self._lock:
                self.requests.append(
                    (m.group(1).decode(), m.group(2).decode(), (int(rng.group(1)), int(rng.group(2))) if rng else None)
                )
            end = m.end()
        return data[end:][-65536:]

    def reset(self) -> None:
        with self._lock:
            self.received = self.sent_bytes = 0
            self.requests.clear()

    def bytes_asked(self, key: str, size: int) -> int:
        """Bytes of object ``key`` (``bucket/path``) requested with GET: range lengths, or the whole object."""
        total = 0
        for method, path, rng in self.requests:
            if method == "GET" and path.split("?", 1)[0].lstrip("/") == key:
                total += (rng[1] - rng[0] + 1) if rng else size
        return total
