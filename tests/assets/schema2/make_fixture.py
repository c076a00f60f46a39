"""How ``tests/assets/schema2/`` was made: a small version of manifest schema 2 and its catalog, kept byte for byte.

    python tests/assets/schema2/make_fixture.py       # with the code that writes schema 2 only

It was run with the code of commit c304d2d (``git archive c304d2d src`` into
a directory put first on ``PYTHONPATH``).

It writes ``two.parquet`` (48 passages of Tiny Shakespeare, three speeches
each, from ../shared/corpora), builds it as ``two@v1`` (cl100k_base,
``--val-fraction 0.1 --shard-tokens 2000``: three train shards and one val
shard in the split directories) into a temporary data root and catalog, and
copies ``data/`` and ``catalog/`` here (the catalog's version path is relative:
the tree can be copied anywhere). It refuses to run once the code writes
another schema: the fixture stands for versions published before that.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
SHAKESPEARE = HERE.parents[2].parent / "shared" / "corpora" / "tinyshakespeare.txt"
OPTIONS = dict(name="two", val_fraction=0.1, shard_tokens=2000)


def texts() -> list[str]:
    speeches = SHAKESPEARE.read_text(encoding="utf-8").split("\n\n")
    return ["\n\n".join(speeches[i : i + 3]) for i in range(0, 3 * 48, 3)]


def main() -> int:
    from shardflow.pipeline import build
    from shardflow.config import BuildConfig
    from shardflow.manifest import SCHEMA_VERSION, read_manifest

    if SCHEMA_VERSION != 2:
        print(f"this code writes manifest schema {SCHEMA_VERSION}; the fixture is frozen at schema 2", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        source = root / "two.parquet"
        pq.write_table(pa.table({"text": pa.array(texts(), type=pa.string())}), source)
        result = build(BuildConfig(sources=(str(source),), **OPTIONS), data_root=root / "data", catalog=root / "catalog")
        assert result.ref == "two@v1" and read_manifest(Path(result.manifest_path).parent).schema_version == 2
        for stale in ("data", "catalog", "two.parquet"):
            target = HERE / stale
            if target.is_dir():
                shutil.rmtree(target)
        shutil.copy(source, HERE / "two.parquet")
        shutil.copytree(root / "data", HERE / "data", ignore=shutil.ignore_patterns(".*.lock", ".staging", ".fingerprints.json"))
        shutil.copytree(root / "catalog", HERE / "catalog", ignore=shutil.ignore_patterns(".*.lock"))
    print(f"wrote {HERE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
