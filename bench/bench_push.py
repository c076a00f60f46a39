"""Benchmark: what ``shardflow push`` costs over a plain upload of the same files, on a loopback S3 server.

    python bench/bench_push.py                       # a 64 MB make_corpus build, 3 alternating rounds
    python bench/bench_push.py --mb 256 --rounds 5

A version is built locally (``shardflow.pipeline.build``, no Prefect) from a
``make_corpus`` corpus; then, round after round, the same files are sent to
fresh prefixes of a bucket on moto's S3 server (``moto[server]``, the test
extra) two ways:

* ``raw``: ``s3fs``'s ``put_file`` of every file of the version directory
  (the floor: the store, the client and the loopback; nothing checked);
* ``push``: ``push_version`` (validate without checksums, claim, stream
  each file hashing it as it goes, SHA-256 as object metadata, manifest last,
  conditional catalog write), ``--workers`` files at once, as the build's
  ``--no-prefect`` push does.

It prints each round, then the medians and push ÷ raw (1.0: no cost over the
floor). The server runs in this process on these 2 cores, so absolute MB/s
say little about a real store; the ratio is the figure. The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MAKE_CORPUS = REPO.parent / "shared" / "tools" / "make_corpus.py"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=64, help="MB of make_corpus text (default 64)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=8, help="files sent at once, both ways (default 8)")
    args = ap.parse_args()

    from loopback_s3 import start_moto

    server = start_moto()
    import s3fs

    from shardflow.pipeline import build
    from shardflow.config import BuildConfig
    from shardflow.bucket.push import push_version

    with tempfile.TemporaryDirectory(prefix="bench-push-") as tmp:
        root = Path(tmp)
        subprocess.run([sys.executable, str(MAKE_CORPUS), str(root / "corpus"), "--mb", str(args.mb), "--files", "4"],
                       check=True, capture_output=True)
        result = build(BuildConfig(name="bp", sources=(str(root / "corpus"),), val_fraction=0.01),
                       data_root=root / "data", catalog=root / "catalog", workers=2)
        version = Path(result.manifest_path).parent
        files = [p for p in sorted(version.rglob("*")) if p.is_file()]
        size = sum(p.stat().st_size for p in files)
        print(f"{result.ref}: {len(files)} files, {size / 1e6:.1f} MB", flush=True)
        fs = s3fs.S3FileSystem(skip_instance_cache=True)
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        fs.mkdir(bucket)

        def raw(prefix: str) -> None:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(args.workers) as pool:
                list(pool.map(lambda p: fs.put_file(str(p), f"{bucket}/{prefix}/{p.relative_to(version).as_posix()}"),
                              files))

        def push(prefix: str) -> None:
            r = push_version(result.ref, data_root_url=f"s3://{bucket}/{prefix}", catalog_url=f"s3://{bucket}/cat-{prefix}",
                             catalog=root / "catalog", workers=args.workers, checksums=False)
            assert r.uploaded > 0 and not r.copied and not r.skipped, r

        seconds: dict[str, list[float]] = {"raw": [], "push": []}
        for i in range(args.rounds):
            for name, fn in (("raw", raw), ("push", push)) if i % 2 == 0 else (("push", push), ("raw", raw)):
                t0 = time.perf_counter()
                fn(f"{name}{i}")
                seconds[name].append(time.perf_counter() - t0)
            print(f"round {i + 1}: raw {seconds['raw'][-1]:.2f} s, push {seconds['push'][-1]:.2f} s", flush=True)
    server.stop()
    med = {k: statistics.median(v) for k, v in seconds.items()}
    ratio = med["push"] / med["raw"]
    print(f"medians: raw {med['raw']:.2f} s ({size / 1e6 / med['raw']:.0f} MB/s), push {med['push']:.2f} s "
          f"({size / 1e6 / med['push']:.0f} MB/s); push / raw = {ratio:.2f}")
    print(json.dumps({"bytes": size, "files": len(files), "raw_s": seconds["raw"], "push_s": seconds["push"],
                      "push_over_raw": round(ratio, 3)}))


if __name__ == "__main__":
    main()
