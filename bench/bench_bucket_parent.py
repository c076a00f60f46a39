"""Benchmark: an incremental build to a bucket from a scratch that lacks the parent, against tokenizing again.

    python bench/bench_bucket_parent.py                                  # a 64 MB make_corpus corpus, 16 inputs
    python bench/bench_bucket_parent.py --corpus /tmp/bench/realistic    # a directory of Parquet files (non-repeating)
    python bench/bench_bucket_parent.py --mb 4 --embed                   # with embeddings (fp32: see docs/EMBEDDINGS.md)

The bucket is moto's S3 server (``moto[server]``, the test extra), in this
process on loopback. ``v1`` is built from all inputs but the last one and
published to a prefix of the bucket once; each round copies that prefix
(within the bucket) to fresh ones, then builds all the inputs there with
``shardflow build ... --no-prefect`` (a build to a bucket, one input more than
``v1``) three ways, in rotating order:

* ``fetch``: an empty scratch (a fresh machine): ``v1`` is fetched, verified,
  and only the new input is tokenized (``bucket_build.fetch_parent``);
* ``tokenize``: an empty scratch with ``SHARDFLOW_NO_REUSE=1``: every input
  tokenized again (what such a build did before ``fetch_parent``), the shards
  equal to ``v1``'s still copied within the bucket, not sent;
* ``local``: a scratch that holds ``v1`` already (the machine that built it;
  a hard-linked copy of it), the floor.

With ``--embed`` every build embeds its documents too; ``fetch`` and ``local``
then link ``v1``'s embeddings of the shards they link (``pipeline/embed_stage.py``), and
``tokenize`` embeds every document again.

It prints each round, the medians, and fetch ÷ tokenize and fetch ÷ local. The
server shares this machine's cores with the builds, so absolute seconds say
little about a real store; the ratios are the figures. The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MAKE_CORPUS = REPO.parent / "shared" / "tools" / "make_corpus.py"
ARMS = ("fetch", "tokenize", "local")


def shardflow(args: list[str], cwd: Path, **env: str) -> None:
    done = subprocess.run([sys.executable, "-m", "shardflow", "build", *args, "--no-prefect", "--progress",
                           "none"], cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"shardflow build {' '.join(args)} failed:\n{done.stderr[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=64, help="MB of make_corpus text in 16 files (default 64)")
    ap.add_argument("--corpus", type=Path, help="a directory of Parquet files instead (at least 2)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--embed", action="store_true", help="build with --embed --embed-precision fp32")
    args = ap.parse_args()

    from loopback_s3 import start_moto

    server = start_moto()
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    fs.mkdir(bucket)
    seconds: dict[str, list[float]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory(prefix="bench-parent-") as tmp:
        root = Path(tmp)
        corpus = args.corpus
        if corpus is None:
            corpus = root / "corpus"
            subprocess.run([sys.executable, str(MAKE_CORPUS), str(corpus), "--mb", str(args.mb), "--files", "16"],
                           check=True, capture_output=True)
        inputs = sorted(str(p) for p in corpus.glob("*.parquet"))
        if len(inputs) < 2:
            raise SystemExit(f"{corpus}: needs at least 2 Parquet files")
        options = ["--name", "bp", "--val-fraction", "0.01", *(["--embed", "--embed-precision", "fp32"] if args.embed else [])]

        def places(prefix: str, scratch: Path) -> list[str]:
            return ["--data-root", f"s3://{bucket}/{prefix}/data", "--catalog", f"s3://{bucket}/{prefix}/catalog",
                    "--scratch", str(scratch)]

        t0 = time.perf_counter()
        shardflow([*inputs[:-1], *options, *places("v1", root / "v1-scratch")], root)
        print(f"v1 of {len(inputs) - 1} inputs built and published in {time.perf_counter() - t0:.1f} s", flush=True)
        for i in range(args.rounds):
            order = ARMS[i % 3:] + ARMS[: i % 3]
            for arm in order:
                prefix, scratch = f"r{i}-{arm}", root / f"r{i}-{arm}"
                fs.copy(f"{bucket}/v1/", f"{bucket}/{prefix}/", recursive=True)  # v1 only, as published
                if arm == "local":  # the machine that built v1: its scratch, hard-linked
                    shutil.copytree(root / "v1-scratch" / bucket / "v1", scratch / bucket / prefix, copy_function=os.link)
                env = {"SHARDFLOW_NO_REUSE": "1"} if arm == "tokenize" else {}
                t0 = time.perf_counter()
                shardflow([*inputs, *options, *places(prefix, scratch)], root, **env)
                seconds[arm].append(time.perf_counter() - t0)
                shutil.rmtree(scratch)
            print(f"round {i + 1}: " + ", ".join(f"{arm} {seconds[arm][-1]:.2f} s" for arm in ARMS), flush=True)
    server.stop()
    med = {arm: statistics.median(v) for arm, v in seconds.items()}
    ratios = {"fetch_over_tokenize": med["fetch"] / med["tokenize"], "fetch_over_local": med["fetch"] / med["local"]}
    print("medians: " + ", ".join(f"{arm} {med[arm]:.2f} s" for arm in ARMS)
          + f"; fetch / tokenize = {ratios['fetch_over_tokenize']:.2f}, fetch / local = {ratios['fetch_over_local']:.2f}")
    print(json.dumps({"inputs": len(inputs), "embed": args.embed, "seconds": seconds, **{k: round(v, 3) for k, v in ratios.items()}}))


if __name__ == "__main__":
    main()
