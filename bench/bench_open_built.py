"""Benchmark: opening a *built* version of a few thousand shards, its shards in a shard table or in its YAML.

    python bench/bench_open_built.py                         # a 12 MB corpus, shard_tokens 1000: ~3,000 shards
    python bench/bench_open_built.py --mb 24 --work DIR      # larger; DIR keeps the corpus and both versions

``bench/bench_open.py`` opens synthetic versions of 35,000 tiny shards; this one opens what
``shardflow build`` publishes. It makes a corpus with ``shared/tools/make_corpus.py`` (``--mb``, 4 files) and
builds it twice with ``--shard-tokens`` (default 1000: about one shard per document), into two data roots:

* ``table``: as builds publish it (more than ``SHARD_TABLE_ABOVE`` shards: a shard table, schema 4);
* ``yaml``: the same build with the threshold raised past its shard count in the building process, so its
  manifest lists the shards in its YAML (schema 3, what builds wrote before the table).

Then opens each with default options (``seq_len=16``), in a fresh process per run, warm and with the version's
files evicted, as ``bench_open.py`` does (its child, timing and eviction): ``TokenDataset``,
``StreamingTokenDataset``, ``open_shards``, and the floors ``read`` and ``yaml``. Median of ``--runs``.
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
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests"), str(ROOT / "bench")]

import bench_open  # noqa: E402
from support.wide_version import WideVersion  # noqa: E402

MAKE_CORPUS = ROOT.parent / "shared" / "tools" / "make_corpus.py"

BUILD = r"""
import sys
import shardflow.manifest as m
from shardflow.config import BuildConfig
from shardflow.pipeline import build
corpus, root, shard_tokens, above = sys.argv[1:5]
if above:
    m.SHARD_TABLE_ABOVE = int(above)
files = sorted(str(p) for p in __import__("pathlib").Path(corpus).glob("*.parquet"))
r = build(BuildConfig(name="built", sources=tuple(files), shard_tokens=int(shard_tokens), val_fraction=0.0),
          data_root=f"{root}/data", catalog=f"{root}/manifests", workers=2)
print(r.ref)
"""


def make(work: Path, layout: str, corpus: Path, shard_tokens: int) -> WideVersion:
    root = work / layout
    if not (root / "data" / "built" / "v1" / "metadata.yaml").is_file():
        above = str(10**9) if layout == "yaml" else ""  # yaml: never a table; table: the default threshold
        subprocess.run([sys.executable, "-c", BUILD, str(corpus), str(root), str(shard_tokens), str(above)], check=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    from shardflow.manifest import read_manifest

    directory = (root / "data" / "built" / "v1").resolve()
    manifest = read_manifest(directory)
    shards = sum(len(s.shards) for s in manifest.splits.values())
    assert (manifest.shard_table is not None) == (layout == "table"), f"{directory}: not the {layout} layout"
    return WideVersion("built@v1", root / "manifests", root / "data", directory, shards)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path)
    ap.add_argument("--mb", type=int, default=12)
    ap.add_argument("--shard-tokens", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    tmp = None
    if args.work is None:
        tmp = tempfile.TemporaryDirectory(prefix="bench-open-built-")
        args.work = Path(tmp.name)
    corpus = args.work / "corpus"
    if not corpus.is_dir():
        subprocess.run([sys.executable, str(MAKE_CORPUS), str(corpus), "--mb", str(args.mb), "--files", "4"], check=True)
    report: dict[str, object] = {"mb": args.mb, "shard_tokens": args.shard_tokens, "runs": args.runs, "layouts": {}}
    try:
        for layout in ("table", "yaml"):
            w = make(args.work, layout, corpus, args.shard_tokens)
            manifest_kb = (w.directory / "metadata.yaml").stat().st_size / 1e3
            table = w.directory / "shards.tsv"
            table_kb = table.stat().st_size / 1e3 if table.exists() else 0.0
            print(f"\n{layout}: {w.ref}, {w.shards:,} shards, manifest {manifest_kb:.0f} kB, table {table_kb:.0f} kB")
            os.sync()
            entry: dict[str, object] = {"shards": w.shards, "manifest_kb": manifest_kb, "table_kb": table_kb}
            entry.update(bench_open.measure_caches(w, args.runs, ratios=False))
            report["layouts"][layout] = entry  # type: ignore[index]
    finally:
        if tmp is not None:
            tmp.cleanup()
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
