"""Each input byte is read once in a first build (issue 44, item 1): planning reads no input that tokenizing reads.

Measured as the bytes this process read (``rchar`` of ``/proc/self/io``, every
thread of it: ``build`` runs its jobs on threads) from the start of the build
until the stage after tokenize-unit starts, against the inputs' total size.
That window holds every read of an input; the later stages read the build's own
output (validate-shard re-reads every shard it checks, issue 44 item 2), so they
are left out. The shards are ``bin`` (a format whose header is written first,
so the writer hashes its tokens as they pass and reads nothing back).
Before this change planning hashed every input (a first read) and tokenizing
read it again: about 2x.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from support.corpus import make_corpus, small_vocab, text_records, write_jsonl
from support.paths import SAMPLE

import pyarrow.parquet as pq

from shardflow.config import BuildConfig
from shardflow.manifest import read_manifest
from shardflow.pipeline import build
from shardflow.pipeline.plan import build_key
from shardflow.pipeline.run import Events
from shardflow.sources import discover_inputs, fingerprint_inputs
from shardflow.tokenizers import load_tokenizer

pytestmark = pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs /proc/self/io (Linux)")


def _rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("/proc/self/io has no rchar")


class _ReadUntilLayout(Events):
    """``rchar`` when the stage after tokenize-unit starts."""

    def __init__(self) -> None:
        self.at_layout: int | None = None

    def stage_started(self, stage, plan, jobs) -> None:
        if stage.name == "layout" and self.at_layout is None:
            self.at_layout = _rchar()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict:
    base = tmp_path_factory.mktemp("read-once")
    files = make_corpus(base / "parquet", mb=12, files=2)  # real text, 2 Parquet files of ~3.7 MB (compressed)
    texts = [t for t in pq.read_table(files[0], columns=["text"]).column(0).to_pylist()[:400]]
    write_jsonl(base / "jsonl" / "docs.jsonl", text_records(texts))
    vocab = small_vocab(base)
    # Imports, the tokenizer and the writers' first use are paid here, not in the measured builds.
    build(BuildConfig(name="warm", sources=(str(SAMPLE),), tokenizer=str(vocab), format="bin"),
          data_root=base / "warm" / "data", catalog=base / "warm" / "cat", workers=2)
    return {"base": base, "vocab": vocab}


def _measured_build(config: BuildConfig, root: Path) -> tuple[float, float, object]:
    """(bytes read until layout / input bytes, bytes read by the whole build / input bytes, its result)."""
    size = sum(inp.size for inp in discover_inputs(config.sources))
    events = _ReadUntilLayout()
    before = _rchar()
    result = build(config, data_root=root / "data", catalog=root / "cat", workers=2, events=events)
    after = _rchar()
    until_layout = (events.at_layout if events.at_layout is not None else after) - before
    return until_layout / size, (after - before) / size, result


@pytest.mark.parametrize("kind, most, rebuilt_most", [("parquet", 1.05, 0.05), ("jsonl", 2.05, 1.05)])
def test_a_first_build_reads_each_input_byte_once(corpus, kind, most, rebuilt_most, tmp_path):
    """Parquet: read once, footers aside (planning reads each footer to cut the units). JSON Lines: planning counts
    a local file's lines (its row numbers are the split's identity, sources/jsonl.py), every build, and hashes it
    in that pass, then tokenizing reads it: twice, the documented exception (three times before)."""
    config = BuildConfig(name="once", sources=(str(corpus["base"] / kind),), tokenizer=str(corpus["vocab"]), format="bin")
    ratio, _, result = _measured_build(config, tmp_path)
    assert ratio <= most, f"read {ratio:.3f}x the inputs' bytes until the layout"
    # What the workers hashed is each file's SHA-256, and the build key is the content's, as if planning had hashed.
    manifest = read_manifest(Path(result.manifest_path).parent)
    for entry in manifest.inputs:
        assert entry["sha256"] == hashlib.sha256(Path(entry["path"]).read_bytes()).hexdigest()
    hashed = fingerprint_inputs(discover_inputs(config.sources))
    assert manifest.build_key == build_key(config, hashed, load_tokenizer(config.tokenizer))
    # The workers recorded the hashes in the fingerprint cache: a rebuild finds the version without hashing the
    # inputs (planning reads a Parquet file's footer, and counts a JSON Lines file's lines).
    _, whole, rebuilt = _measured_build(config, tmp_path)
    assert (rebuilt.ref, rebuilt.created) == (result.ref, False)
    assert whole <= rebuilt_most, f"a rebuild of unchanged inputs read {whole:.3f}x their bytes"
