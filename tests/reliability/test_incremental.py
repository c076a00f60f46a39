"""Incremental versions: a rebuild tokenizes only new or changed inputs and hard-links unchanged shards.

A scheduled run over a growing source directory: v1 from A, B; C added -> v2;
B changed -> v3; A removed -> v4; nothing changed -> no new version. Every
version must be byte-identical to a full build of the same inputs in another
data root (every shard, every index, and the manifest but for when, where,
which version and how its tokens were obtained).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from support.builds import assert_same_version, build_in, leftovers, versions
from support.cli import run_cli
from support.corpus import copy_into, make_corpus, split_sample
from shardflow.pipeline import NO_REUSE_ENV
from shardflow.manifest import read_manifest

NAME = "inc"
OPTIONS: dict[str, Any] = dict(shard_tokens=60_000, val_fraction=0.1, seed=5)


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The scheduled-run history, each version next to a full build of the same inputs."""
    base = tmp_path_factory.mktemp("incremental")
    a, b, c = make_corpus(base / "corpus", mb=1.2, files=3)
    src = copy_into([a, b], base / "src")
    root = base / "sched"
    caplog_records: dict[str, list[str]] = {}
    handler = _Collect()
    logger = logging.getLogger("shardflow.pipeline")
    old_level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        out: dict[str, Any] = {"base": base, "src": src, "root": root, "names": (a.name, b.name, c.name)}

        def step(key: str) -> None:
            handler.lines.clear()
            result = build_in(root, src, NAME, OPTIONS, workers=2)
            caplog_records[key] = [m.group(1) for line in handler.lines if (m := re.match(r"tokenized unit \d+ of (\S+):", line))]
            full = build_in(base / f"full-{key}", src, NAME, OPTIONS, workers=2, reuse=False)
            out[key] = (result, Path(result.manifest_path).parent, Path(full.manifest_path).parent)

        step("v1")
        shutil.copy(c, src / c.name)  # a new file arrives
        step("v2")
        table = pq.read_table(src / b.name)  # B is rewritten under the same name
        pq.write_table(table.slice(0, table.num_rows - 5), src / b.name, row_group_size=64)
        step("v3")
        os.remove(src / a.name)  # A is withdrawn
        step("v4")
        handler.lines.clear()
        before = (root / "catalog" / f"{NAME}.yaml").read_bytes()
        out["again"] = build_in(root, src, NAME, OPTIONS, workers=2)
        out["again_catalog"] = (before, (root / "catalog" / f"{NAME}.yaml").read_bytes())
        caplog_records["again"] = list(handler.lines)
        out["tokenized"] = caplog_records
        return out
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.mark.slow
def test_every_version_is_byte_identical_to_a_full_build(chain):
    for key in ("v1", "v2", "v3", "v4"):
        result, version, full = chain[key]
        assert result.created and result.ref == f"{NAME}@{key}"
        assert_same_version(version, full)
    assert versions(chain["root"], NAME) == ["v1", "v2", "v3", "v4"]
    assert leftovers(chain["root"] / "data") == []


@pytest.mark.slow
def test_an_added_input_is_the_only_one_tokenized(chain):
    a, b, c = chain["names"]
    assert sorted(set(chain["tokenized"]["v1"])) == [a, b]
    assert set(chain["tokenized"]["v2"]) == {c}
    m = read_manifest(chain["v2"][1])
    assert m.parent == f"{NAME}@v1"
    assert m.extra["reuse"]["parent"] == f"{NAME}@v1"
    assert m.extra["reuse"]["reused_inputs"] == [a, b]
    assert m.extra["reuse"]["tokenized_inputs"] == [c]
    assert [i["relname"] for i in m.inputs] == [a, b, c]
    assert "reuse" not in read_manifest(chain["v1"][1]).extra


@pytest.mark.slow
def test_appending_hard_links_every_train_shard_of_the_parent_and_rewrites_no_tail(chain):
    v1, v2 = chain["v1"][1], chain["v2"][1]
    m1, m2 = read_manifest(v1), read_manifest(v2)
    old = m1.splits["train"].shards
    assert len(old) >= 2
    for k, shard in enumerate(old):  # every train shard of v1, the last one too: the new file's come after them
        new = m2.splits["train"].shards[k]
        assert (v1 / shard.file).stat().st_ino == (v2 / new.file).stat().st_ino, f"train shard {k} was not hard-linked"
        assert (new.sha256, new.tokens) == (shard.sha256, shard.tokens)
    assert m2.extra["reuse"]["linked_shards"] == len(old)
    a, b, c = (inp["shards"]["train"] for inp in m2.inputs)
    assert (a[0], b[0], c[0]) == (0, a[1], a[1] + b[1]) and c[1] >= 1  # the added input's shards, after the others
    # The val split is gathered (small): written again, from v1's val tokens and the new file's.
    assert m2.totals["tokens"] > m1.totals["tokens"]


@pytest.mark.slow
def test_a_changed_input_is_detected_by_its_fingerprint_and_retokenized(chain):
    a, b, c = chain["names"]
    assert set(chain["tokenized"]["v3"]) == {b}
    m2, m3 = read_manifest(chain["v2"][1]), read_manifest(chain["v3"][1])
    assert m3.extra["reuse"]["reused_inputs"] == [a, c]
    old_b = next(i for i in m2.inputs if i["relname"] == b)
    new_b = next(i for i in m3.inputs if i["relname"] == b)
    assert old_b["sha256"] != new_b["sha256"] and new_b["rows"] == old_b["rows"] - 5
    # The other inputs keep their shards: A's and C's stay hard-linked, C's under new numbers after B's.
    v2, v3 = chain["v2"][1], chain["v3"][1]
    for inp in (0, 2):
        first2, n2 = m2.inputs[inp]["shards"]["train"]
        first3, n3 = m3.inputs[inp]["shards"]["train"]
        assert n2 == n3
        for j in range(n2):
            s2, s3 = m2.splits["train"].shards[first2 + j], m3.splits["train"].shards[first3 + j]
            assert (v2 / s2.file).stat().st_ino == (v3 / s3.file).stat().st_ino


@pytest.mark.slow
def test_a_removed_input_leaves_the_new_version(chain):
    a, b, c = chain["names"]
    m4 = read_manifest(chain["v4"][1])
    assert [i["relname"] for i in m4.inputs] == [b, c]
    assert chain["tokenized"]["v4"] == []  # B and C come from v3
    assert m4.extra["reuse"]["reused_inputs"] == [b, c]
    assert m4.totals["input_rows"] == sum(i["rows"] for i in m4.inputs)


@pytest.mark.slow
def test_no_change_publishes_no_new_version(chain):
    again = chain["again"]
    assert not again.created and again.ref == f"{NAME}@v4"
    before, after = chain["again_catalog"]
    assert before == after
    assert not [line for line in chain["tokenized"]["again"] if line.startswith(("tokenized", "wrote", "linked"))]


@pytest.mark.slow
def test_manifest_records_each_inputs_place_in_each_split(chain):
    m = read_manifest(chain["v2"][1])
    for split, entry in m.splits.items():
        token = doc = 0
        for inp in m.inputs:
            rng = inp["splits"][split]
            assert (rng["first_token"], rng["first_document"]) == (token, doc)
            token += rng["tokens"]
            doc += rng["documents"]
        assert (token, doc) == (entry.tokens, entry.documents)
    for inp in m.inputs:
        for key in ("rows", "null_texts", "empty_texts", "invalid_utf8", "skipped_invalid_utf8", "max_token_id"):
            assert key in inp


@pytest.mark.slow
def test_other_options_or_val_count_reuse_nothing(tmp_path):
    src = split_sample(tmp_path / "src", (30, 31))
    part1 = src / "part1.parquet"
    held = tmp_path / "part1.parquet"
    shutil.move(part1, held)
    root = tmp_path / "r"
    build_in(root, src, "o", dict(shard_tokens=40_000))
    shutil.move(held, part1)
    # Another shard size: a different layout, nothing reusable.
    other = build_in(root, src, "o", dict(shard_tokens=30_000))
    assert "reuse" not in read_manifest(Path(other.manifest_path).parent).extra
    # val_count picks documents over the whole corpus: never reused.
    vc = build_in(root, src, "o", dict(shard_tokens=30_000, val_count=5))
    shutil.move(part1, held)
    vc_less = build_in(root, src, "o", dict(shard_tokens=30_000, val_count=5))
    assert "reuse" not in read_manifest(Path(vc_less.manifest_path).parent).extra
    assert vc.ref != vc_less.ref


VAL_COUNT_LINE = (
    "--val-count 5 holds out an exact number of documents over the whole corpus, so this rebuild tokenizes every "
    "input again (1 unchanged since vc@v1); --val-fraction rebuilds tokenize only new or changed files"
)


def _tokenized_inputs(result: Any) -> list[str]:
    """The inputs the build tokenized, from its manifest (``reuse`` section, else every input)."""
    m = read_manifest(Path(result.manifest_path).parent)
    return m.extra["reuse"]["tokenized_inputs"] if "reuse" in m.extra else [i["relname"] for i in m.inputs]


def test_a_val_count_rebuild_says_why_it_tokenizes_everything(tmp_path, caplog):
    """An exact count over the whole corpus can't be stable under added inputs: kept exact, and said in one line."""
    src = split_sample(tmp_path / "src", (30, 31))
    held = tmp_path / "part1.parquet"
    shutil.move(src / "part1.parquet", held)
    root = tmp_path / "r"
    caplog.set_level(logging.WARNING, logger="shardflow.pipeline")
    build_in(root, src, "vc", dict(shard_tokens=30_000, val_count=5))
    assert not [r for r in caplog.records if "--val-count" in r.getMessage()]  # no parent: nothing to say
    shutil.move(held, src / "part1.parquet")
    caplog.clear()
    tokenized: list[int] = []
    v2 = build_in(root, src, "vc", dict(shard_tokens=30_000, val_count=5), on_unit=lambda r: tokenized.append(r.unit))
    # That line and no other: its schema 3 parent's shards are not why (it has no placed split to link).
    warned = [r.getMessage() for r in caplog.records if r.name == "shardflow.pipeline" and r.levelno >= logging.WARNING]
    assert warned == [VAL_COUNT_LINE]
    assert _tokenized_inputs(v2) == ["part0.parquet", "part1.parquet"]
    assert sorted(tokenized) == [0, 1]  # one unit per input (each far under unit_bytes), both tokenized again
    m = read_manifest(Path(v2.manifest_path).parent)
    assert m.splits["val"].documents == 5  # the count stays exact


def test_a_val_fraction_rebuild_tokenizes_only_the_added_file(tmp_path, caplog):
    """The README's claim, for the option that keeps it: the parent's input is taken, not tokenized again."""
    src = split_sample(tmp_path / "src", (30, 31))
    held = tmp_path / "part1.parquet"
    root = tmp_path / "r"
    caplog.set_level(logging.WARNING, logger="shardflow.pipeline")
    shutil.move(src / "part1.parquet", held)
    build_in(root, src, "vf", dict(shard_tokens=30_000, val_fraction=0.1))
    shutil.move(held, src / "part1.parquet")
    caplog.clear()
    vf = build_in(root, src, "vf", dict(shard_tokens=30_000, val_fraction=0.1))
    assert _tokenized_inputs(vf) == ["part1.parquet"]
    assert read_manifest(Path(vf.manifest_path).parent).extra["reuse"]["reused_inputs"] == ["part0.parquet"]
    assert not [r for r in caplog.records if "--val-count" in r.getMessage()]


@pytest.mark.slow
def test_the_val_count_line_is_printed_once_on_stderr(tmp_path):
    src = split_sample(tmp_path / "src", (30, 31))
    held = tmp_path / "part1.parquet"
    shutil.move(src / "part1.parquet", held)
    where = ["--no-prefect", "--progress", "none", "--data-root", str(tmp_path / "data"),
             "--catalog", str(tmp_path / "cat"), "--val-count", "5", "--shard-tokens", "30000"]
    first = run_cli(["build", str(src), "--name", "vc", *where])
    assert first.returncode == 0 and first.stderr == "", first.stderr
    shutil.move(held, src / "part1.parquet")
    again = run_cli(["build", str(src), "--name", "vc", *where])
    assert again.returncode == 0, again.stderr
    assert again.stderr == VAL_COUNT_LINE + "\n"
    assert again.stdout.startswith("published vc@v2")


@pytest.mark.slow
def test_reuse_can_be_turned_off(tmp_path, monkeypatch):
    src = split_sample(tmp_path / "src", (30, 31))
    held = tmp_path / "part1.parquet"
    shutil.move(src / "part1.parquet", held)
    root = tmp_path / "r"
    build_in(root, src, "off", dict(shard_tokens=40_000))
    shutil.move(held, src / "part1.parquet")
    monkeypatch.setenv(NO_REUSE_ENV, "1")
    v2 = build_in(root, src, "off", dict(shard_tokens=40_000))
    assert "reuse" not in read_manifest(Path(v2.manifest_path).parent).extra


def _grown(tmp_path: Path) -> tuple[Path, Path, Path]:
    """v1 of dataset 'dmg' from the sample's first 45 rows; the rest then arrives as a second file."""
    src = split_sample(tmp_path / "src", (45, 16))
    held = tmp_path / "part1.parquet"
    shutil.move(src / "part1.parquet", held)
    root = tmp_path / "r"
    v1 = Path(build_in(root, src, "dmg", dict(shard_tokens=30_000)).manifest_path).parent
    shutil.move(held, src / "part1.parquet")
    return src, root, v1


def _flip_byte(path: Path, offset: int) -> None:
    # Replace the file (new inode) so that no hard-linked twin changes with it.
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(bytes(data))
    os.replace(tmp, path)


@pytest.mark.slow
def test_a_damaged_parent_shard_is_never_copied_into_a_new_version(tmp_path):
    src, root, v1 = _grown(tmp_path)
    m1 = read_manifest(v1)
    tail = m1.splits["train"].shards[-1]  # partial: its tokens are read and copied, not linked
    _flip_byte(v1 / tail.file, 2000)
    # Planning finds it changed since the publish (a new inode): its inputs are tokenized again,
    # never a dead end (issue 26, case 6), and the new version is built from the inputs alone.
    v2 = build_in(root, src, "dmg", dict(shard_tokens=30_000))
    assert "reuse" not in read_manifest(Path(v2.manifest_path).parent).extra
    full = build_in(tmp_path / "full", src, "dmg", dict(shard_tokens=30_000))
    assert_same_version(Path(v2.manifest_path).parent, Path(full.manifest_path).parent)


@pytest.mark.slow
def test_a_parent_shard_copied_from_is_read_again_only_if_modified_since_its_publish(tmp_path, monkeypatch):
    """Its bytes were validated when the parent was published: unmodified since (size, inode, mtime as recorded),
    it is not hashed again; modified, the parent's inputs are tokenized again instead (issue 26)."""
    import hashlib

    from shardflow.pipeline import incremental

    hashed: list[str] = []
    real = hashlib.file_digest

    def file_digest(f, name):  # noqa: ANN001, ANN202
        hashed.append(Path(f.name).name)
        return real(f, name)

    monkeypatch.setattr(incremental.hashlib, "file_digest", file_digest)
    monkeypatch.setattr(incremental, "_verified", set())  # nothing checked yet in this process
    for touched in (False, True):
        src, root, v1 = _grown(tmp_path / str(touched))
        tail = Path(read_manifest(v1).splits["train"].shards[-1].file)  # partial: copied into the new last shard
        published = (v1 / "metadata.yaml").stat().st_mtime_ns
        assert (v1 / tail).stat().st_mtime_ns <= published
        if touched:  # content unchanged, but written to (as far as its mtime says) after the publish
            later = published + 5 * 10**9
            os.utime(v1 / tail, ns=(later, later))
        hashed.clear()
        v2 = build_in(root, src, "dmg", dict(shard_tokens=30_000))
        assert v2.ref == "dmg@v2"
        # Never hashed: untouched, it is trusted by its recorded size, inode and mtime; touched, planning
        # finds it changed since the publish and tokenizes its inputs again instead of reading it.
        assert hashed.count(tail.name) == 0
        assert ("reuse" in read_manifest(Path(v2.manifest_path).parent).extra) is not touched


@pytest.mark.slow
def test_a_damaged_parent_shard_that_would_be_linked_fails_validation(tmp_path):
    src, root, v1 = _grown(tmp_path)
    first = read_manifest(v1).splits["train"].shards[0]  # complete: it would be hard-linked
    _flip_byte(v1 / first.file, 5000)
    # Changed since its publish (a new inode): not linked; its inputs are tokenized again (issue 26, case 6).
    v2 = build_in(root, src, "dmg", dict(shard_tokens=30_000))
    full = build_in(tmp_path / "full", src, "dmg", dict(shard_tokens=30_000))
    assert_same_version(Path(v2.manifest_path).parent, Path(full.manifest_path).parent)


@pytest.mark.slow
def test_catalog_lists_parents(chain):
    data = yaml.safe_load((chain["root"] / "catalog" / f"{NAME}.yaml").read_text())
    assert [v["parent"] for v in data["versions"]] == [None, f"{NAME}@v1", f"{NAME}@v2", f"{NAME}@v3"]


@pytest.mark.slow
def test_a_same_size_change_with_the_old_mtime_is_still_detected(tmp_path):
    """The fingerprint cache is keyed by stat, ctime included: restoring size and mtime cannot hide an edit."""
    import pyarrow as pa

    src = tmp_path / "src"
    src.mkdir()
    f = src / "a.parquet"
    texts = ["alpha beta gamma", "delta epsilon"]
    pq.write_table(pa.table({"text": texts}), f, compression="none")
    root = tmp_path / "r"
    v1 = build_in(root, src, "same", dict(shard_tokens=1000))
    st = f.stat()
    pq.write_table(pa.table({"text": ["alpha beta gamma", "delta epsiloN"]}), f, compression="none")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_size == st.st_size and f.stat().st_mtime_ns == st.st_mtime_ns
    v2 = build_in(root, src, "same", dict(shard_tokens=1000))
    assert v2.created and v2.ref == "same@v2" and v1.ref == "same@v1"
    m = read_manifest(Path(v2.manifest_path).parent)
    assert m.extra.get("reuse") is None or m.extra["reuse"]["tokenized_inputs"] == ["a.parquet"]
    train = build_in(tmp_path / "fresh", src, "same", dict(shard_tokens=1000))
    assert_same_version(Path(v2.manifest_path).parent, Path(train.manifest_path).parent)
