"""Builds from ``s3://`` against a real S3 endpoint on loopback (moto's server), read in place.

What these show: a build from ``s3://bucket/prefix/`` (Parquet, JSON Lines,
JSON Lines + Zstandard) writes the bytes of a build of a local copy, and
leaves no copy of the inputs under the data root; an incremental rebuild after
one object changed reads only that object; a missing bucket, denied access,
an object deleted mid-build, a truncated ``.zst`` and a bad JSON line are each
one message naming the object, with nothing published; a URL with
credentials is refused; and planning reads O(objects) bytes, not O(corpus).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("s3fs", reason="object storage needs the optional extra: pip install 'shardflow[s3]'")
pytest.importorskip("moto.server", reason="the loopback S3 server is moto[server] (the test extra)")

from support.builds import files_of, make_builder, stable_manifest
from support.cli import run_main
from support.corpus import text_records, write_jsonl, write_parquet
from support.paths import MAKE_CORPUS, SAMPLE
from support.s3 import CountingProxy, environment, new_bucket, s3_fixture, S3Server
from shardflow.pipeline import build, plan_build
from shardflow.catalog import Catalog
from shardflow.config import BuildConfig
from shardflow.errors import InputError
from shardflow.manifest import read_manifest
from shardflow.sources.storage import PLAN_BLOCK

INPUT_SUFFIXES = (".parquet", ".jsonl", ".zst", ".gz", ".arrow")


s3 = s3_fixture("session")


@pytest.fixture
def bucket(s3: S3Server) -> str:
    return new_bucket(s3, "b")


@pytest.fixture(scope="module")
def docs(real_texts) -> list[str]:
    return real_texts[::4]


def make_local(kind: str, root: Path, docs: list[str]) -> Path:
    """A small corpus tree of one kind: three files, one in a subdirectory."""
    thirds = [docs[: len(docs) // 3], docs[len(docs) // 3 : 2 * len(docs) // 3], docs[2 * len(docs) // 3 :]]
    names = ["a", "b", "sub/c"]
    for name, texts in zip(names, thirds):
        if kind == "parquet":
            write_parquet(root / f"{name}.parquet", texts, row_group_size=16)
        elif kind == "arrow":
            table = pa.table({"text": texts})
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            with pa.ipc.new_file(str(root / f"{name}.arrow"), table.schema) as w:
                w.write_table(table, max_chunksize=16)
        else:
            write_jsonl(root / f"{name}.{kind}", text_records(texts))
    return root


def upload(s3: S3Server, local: Path, url_root: str) -> None:
    fs = s3.fs()
    for p in sorted(local.rglob("*")):
        if p.is_file():
            fs.put_file(str(p), f"{url_root}/{p.relative_to(local).as_posix()}")


def no_input_copies(data_root: Path) -> list[Path]:
    return [p for p in data_root.rglob("*") if p.is_file() and p.name.lower().endswith(INPUT_SUFFIXES)]


def published(root: Path, name: str) -> bool:
    cat = root / "catalog"
    return cat.exists() and bool(Catalog(cat).versions(name))


OPTIONS = dict(shard_tokens=40_000, val_fraction=0.2, seed=3, unit_bytes=60_000)


# --- Same bytes as a local copy, and no copy anywhere ---


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["parquet", "jsonl", "jsonl.zst", "arrow"])
def test_an_s3_build_is_byte_identical_to_a_build_of_a_local_copy(tmp_path, s3, bucket, docs, kind):
    local = make_local(kind, tmp_path / "corpus", docs)
    upload(s3, local, f"{bucket}/prefix")
    a = make_builder(tmp_path / "local")(local, name="same", workers=2, **OPTIONS)
    b = make_builder(tmp_path / "s3")(f"s3://{bucket}/prefix/", name="same", workers=2, **OPTIONS)
    assert files_of(a.directory) == files_of(b.directory) and len(files_of(a.directory)) >= 4
    ma, mb = read_manifest(a.directory), read_manifest(b.directory)
    # The manifests differ in the inputs' paths and object identities only: the build key is the content's,
    # computed from the hashes the workers made, so it is the local build's.
    sa, sb = stable_manifest(a.directory), stable_manifest(b.directory)
    sa["config"].pop("sources"), sb["config"].pop("sources")
    assert sa == sb and ma.build_key == mb.build_key
    assert [i["path"] for i in mb.inputs] == [f"s3://{bucket}/prefix/{n}" for n in ("a", "b", "sub/c") for n in [f"{n}.{kind}"]]
    assert all(re.fullmatch(r'ETag="[0-9a-f]{32}"', i["identity"]) for i in mb.inputs)
    # The SHA-256 of every object, computed by the worker that read it, equals the local file's.
    strip = lambda m: [{k: v for k, v in i.items() if k not in ("path", "identity")} for i in m.inputs]  # noqa: E731
    assert strip(ma) == strip(mb)
    assert not no_input_copies(tmp_path / "s3" / "data"), "an input was copied under the data root"
    assert not list((tmp_path / "s3" / "data").rglob(".sources"))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["jsonl", "jsonl.zst"])
def test_a_json_lines_object_is_read_once_its_hash_made_from_the_same_bytes(tmp_path, s3, bucket, docs, kind):
    local = make_local(kind, tmp_path / "corpus", docs)
    upload(s3, local, f"{bucket}/once")
    sizes = {p.relative_to(local).as_posix(): p.stat().st_size for p in local.rglob("*") if p.is_file()}
    proxy = CountingProxy(s3.endpoint)
    try:
        with environment({"AWS_ENDPOINT_URL": proxy.endpoint}):
            # One unit per object (an uncompressed object cut into several is hashed by a read of its own).
            options = {**OPTIONS, "unit_bytes": 1 << 30}
            b = make_builder(tmp_path / "s3")(f"s3://{bucket}/once/", name="once", workers=2, **options)
    finally:
        proxy.close()
    for rel, size in sizes.items():
        # Its first 16 KiB for planning, then every byte once: tokenizing and hashing share the read.
        assert size <= proxy.bytes_asked(f"{bucket}/once/{rel}", size) <= size + (16 << 10), (rel, size)
    expected = {rel: hashlib.sha256((local / rel).read_bytes()).hexdigest() for rel in sizes}
    assert {i["relname"]: i["sha256"] for i in read_manifest(b.directory).inputs} == expected


@pytest.mark.slow
@pytest.mark.parametrize("unit_bytes", [6000])  # its long line spans 7 ranges (2000, 20 ranges, took 2x as long)
def test_json_lines_objects_cut_blind_into_byte_ranges_give_a_local_builds_bytes(tmp_path, s3, bucket, docs, unit_bytes):
    # Blank lines, CRLF, a line longer than many ranges, no newline after the last line.
    records = []
    for i, t in enumerate(docs[:16]):
        records.append(json.dumps({"text": t, "src": f"s{i % 3}"}))
        if i % 5 == 3:
            records += ["", "  \t"]
        if i == 8:
            records.append(json.dumps({"text": " ".join(docs[20:24])}))  # spans several ranges
    records.append(json.dumps({"text": "last, no newline"}))
    data = "\r\n".join(records).encode()
    local = tmp_path / "corpus" / "x.jsonl"
    local.parent.mkdir()
    local.write_bytes(data)
    s3.fs().pipe(f"{bucket}/cut/x.jsonl", data)
    options = dict(name="cut", val_fraction=0.2, seed=5, shard_tokens=30_000, stats_column="src")
    a = make_builder(tmp_path / "local")(local, **options)  # one unit
    # Cut into ranges, the val split is decided only once the layout numbers their rows: every split is gathered
    # from all units and cut at whole documents by the rule one unit's pieces follow, so the shards are a's.
    b = make_builder(tmp_path / "s3")(f"s3://{bucket}/cut/x.jsonl", unit_bytes=unit_bytes, workers=2, **options)
    assert files_of(a.directory) == files_of(b.directory)
    ma, mb = read_manifest(a.directory), read_manifest(b.directory)
    assert mb.totals == ma.totals and ma.totals["input_rows"] == len(records) and ma.splits["val"].documents > 0
    assert mb.build_key != ma.build_key  # the same bytes, cut otherwise: the unit size is in the key
    # The statistics too, --stats-column values included: a range's rows count from its own first line.
    assert (b.directory / "stats.json").read_bytes() == (a.directory / "stats.json").read_bytes()
    (entry,) = json.loads((a.directory / "stats.json").read_text())["inputs"]
    by_column = entry["by_column"]  # value -> [documents, tokens]
    # the two records without "src" (the long one and the last) count as (null)
    assert sorted(by_column) == ["(null)", "s0", "s1", "s2"] and by_column["(null)"][0] == 2 and sum(d for d, _ in by_column.values()) == entry["documents"]


@pytest.mark.slow
def test_a_bad_line_in_a_later_byte_range_is_named_by_its_byte_offset(tmp_path, s3, bucket, docs):
    lines = [json.dumps({"text": t}) for t in docs[:30]]
    lines[20] = '{"text": "unterminated'
    data = ("\n".join(lines) + "\n").encode()
    s3.fs().pipe(f"{bucket}/late/x.jsonl", data)
    offset = len("\n".join(lines[:20])) + 1
    config = BuildConfig(name="late", sources=(f"s3://{bucket}/late/x.jsonl",), unit_bytes=2000)
    root = tmp_path / "late"
    with pytest.raises(InputError, match=rf"^s3://{bucket}/late/x\.jsonl the line at byte {offset}: not valid JSON"):
        build(config, data_root=root / "data", catalog=root / "catalog", workers=2)
    assert not published(root, "late")


# --- Incremental: only the changed object is read again ---


@pytest.mark.slow
def test_an_incremental_rebuild_reads_only_the_changed_object(tmp_path, s3, bucket, real_texts):
    docs = real_texts  # all of them: objects of about 1 MB, so that a footer is a small part of one
    local = make_local("parquet", tmp_path / "corpus", docs)
    upload(s3, local, f"{bucket}/inc")
    proxy = CountingProxy(s3.endpoint)
    sizes = {n: (local / n).stat().st_size for n in ("a.parquet", "b.parquet", "sub/c.parquet")}
    try:
        with environment({"AWS_ENDPOINT_URL": proxy.endpoint}):
            make = make_builder(tmp_path / "inc")
            make(f"s3://{bucket}/inc/", name="inc", **OPTIONS)
            write_parquet(local / "b.parquet", list(reversed(docs[:40])), row_group_size=16)
            s3.fs().put_file(str(local / "b.parquet"), f"{bucket}/inc/b.parquet")
            sizes["b.parquet"] = (local / "b.parquet").stat().st_size
            proxy.reset()
            v2 = make(f"s3://{bucket}/inc/", name="inc", **OPTIONS)
    finally:
        proxy.close()
    m = read_manifest(v2.directory)
    assert v2.result.ref == "inc@v2" and m.extra["reuse"]["tokenized_inputs"] == ["b.parquet"]
    assert m.extra["reuse"]["reused_inputs"] == ["a.parquet", "sub/c.parquet"]
    asked = {n: proxy.bytes_asked(f"{bucket}/inc/{n}", s) for n, s in sizes.items()}
    # The changed object is read whole (its text, then its hash); the others only their footers, by planning.
    assert asked["b.parquet"] >= sizes["b.parquet"], asked
    for n in ("a.parquet", "sub/c.parquet"):
        assert asked[n] <= PLAN_BLOCK and asked[n] < sizes[n] // 4, (asked, sizes)
    full = make_builder(tmp_path / "full")(local, name="inc", **OPTIONS)
    assert files_of(v2.directory) == files_of(full.directory)
    assert m.build_key == read_manifest(full.directory).build_key

    # Nothing changed since: the plan knows every object's hash from v2's manifest, and finds v2, reading no object.
    proxy = CountingProxy(s3.endpoint)
    try:
        with environment({"AWS_ENDPOINT_URL": proxy.endpoint}):
            again = make(f"s3://{bucket}/inc/", name="inc", **OPTIONS)
    finally:
        proxy.close()
    assert again.result.ref == "inc@v2" and not again.result.created
    assert all(proxy.bytes_asked(f"{bucket}/inc/{n}", s) <= PLAN_BLOCK for n, s in sizes.items())


# --- Failures: one message naming the object, nothing published ---


def cli_refuses(tmp_path: Path, source: str, pattern: str, *extra: str) -> str:
    root = tmp_path / "cli"
    rc, _, err = run_main("build", source, "--name", "bad", "--no-prefect", "--progress", "none",
                          "--data-root", str(root / "data"), "--catalog", str(root / "catalog"), *extra)
    lines = err.strip().splitlines()
    assert rc == 2, err
    assert "Traceback" not in err
    assert re.search(pattern, lines[-1]), f"{pattern!r} not in {lines[-1]!r}"
    assert not published(root, "bad")
    assert not list((root / "data").glob("bad/v*"))
    return lines[-1]


def test_a_missing_bucket_is_one_message(tmp_path, s3):
    line = cli_refuses(tmp_path, "s3://no-such-bucket-here/corpus/", r"^shardflow: error: s3://no-such-bucket-here/corpus/: no such bucket or object .*check the URL$")
    assert "deleted" not in line


def test_denied_access_is_one_message(tmp_path, s3, bucket, monkeypatch):
    from moto import settings

    s3.fs().put_file(str(SAMPLE), f"{bucket}/d/sample.parquet")
    # moto checks credentials from now on; these keys are unknown to it.
    monkeypatch.setattr(settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
    with environment({"AWS_ACCESS_KEY_ID": "AKIAUNKNOWNKEY000000", "AWS_SECRET_ACCESS_KEY": "wrong"}):
        cli_refuses(tmp_path, f"s3://{bucket}/d/", rf"s3://{bucket}/d/: access denied .*credentials")


@pytest.mark.slow
def test_an_object_deleted_mid_build_is_one_message(tmp_path, s3, bucket, docs):
    local = make_local("jsonl", tmp_path / "corpus", docs)
    upload(s3, local, f"{bucket}/del")
    fs = s3.fs()
    config = BuildConfig(name="del", sources=(f"s3://{bucket}/del/",), **OPTIONS)
    root = tmp_path / "del"

    def delete_after_planning(plan) -> None:
        fs.rm(f"{bucket}/del/b.jsonl")

    with pytest.raises(InputError, match=rf"^s3://{bucket}/del/b\.jsonl: no such bucket or object .*deleted since"):
        build(config, data_root=root / "data", catalog=root / "catalog", on_plan=delete_after_planning)
    assert not published(root, "del") and not list((root / "data").glob("del/v*"))


@pytest.mark.slow
def test_an_object_changed_mid_build_is_one_message(tmp_path, s3, bucket, docs):
    local = make_local("jsonl", tmp_path / "corpus", docs)
    upload(s3, local, f"{bucket}/chg")
    config = BuildConfig(name="chg", sources=(f"s3://{bucket}/chg/",), **OPTIONS)
    root = tmp_path / "chg"

    def change_after_planning(plan) -> None:
        s3.fs().pipe(f"{bucket}/chg/a.jsonl", b'{"text": "another version"}\n')

    with pytest.raises(InputError, match=rf"^s3://{bucket}/chg/a\.jsonl: the object changed during the build"):
        build(config, data_root=root / "data", catalog=root / "catalog", on_plan=change_after_planning)
    assert not published(root, "chg")


def test_prefixes_with_a_dot_name_their_objects_as_local_directories_do(tmp_path, s3, bucket):
    """s3://B/wiki.v1/ was taken for one object: its objects were named after the bucket ("B/part-0.jsonl"),
    and the names decide the splits, so the shards were not a local copy's; two such prefixes clashed."""
    from shardflow.sources import discover_inputs

    for prefix in ("wiki.v1", "wiki.v2", "news"):
        (tmp_path / prefix).mkdir()
        (tmp_path / prefix / "part-0.jsonl").write_text(json.dumps({"text": f"the {prefix} text"}) + "\n")
        s3.fs().put_file(str(tmp_path / prefix / "part-0.jsonl"), f"{bucket}/{prefix}/part-0.jsonl")
    for given in (("wiki.v1", "news"), ("wiki.v1/", "wiki.v2"), ("wiki.v1/part-0.jsonl", "news/part-0.jsonl")):
        local = [i.relname for i in discover_inputs([str(tmp_path / g) for g in given])]
        remote = [i.relname for i in discover_inputs([f"s3://{bucket}/{g}" for g in given])]
        assert remote == local == ["wiki.v1/part-0.jsonl", f"{given[1].split('/')[0]}/part-0.jsonl"]


def test_a_versioned_bucket_builds_and_an_overwritten_object_is_seen_by_the_rebuild(tmp_path, s3, bucket, docs):
    """Its listing gives ETags and its HEAD a VersionId: compared across kinds, every object looked changed
    mid-build, and no build from a versioned bucket could finish."""
    import boto3

    boto3.client("s3", **s3.client_options()).put_bucket_versioning(
        Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    local = make_local("jsonl", tmp_path / "corpus", docs)
    upload(s3, local, f"{bucket}/ver")
    config = BuildConfig(name="ver", sources=(f"s3://{bucket}/ver/",), **OPTIONS)
    root = tmp_path / "ver"
    assert build(config, data_root=root / "data", catalog=root / "catalog").ref == "ver@v1"
    s3.fs().pipe(f"{bucket}/ver/a.jsonl", b'{"text": "another version"}\n')
    again = build(config, data_root=root / "data", catalog=root / "catalog")
    m = read_manifest(Path(again.manifest_path).parent)
    assert again.ref == "ver@v2" and m.extra["reuse"]["tokenized_inputs"] == ["a.jsonl"]


def test_a_truncated_zst_object_is_one_message(tmp_path, s3, bucket, docs):
    path = write_jsonl(tmp_path / "x.jsonl.zst", text_records(docs))
    s3.fs().pipe(f"{bucket}/t/x.jsonl.zst", path.read_bytes()[: path.stat().st_size // 2])
    cli_refuses(tmp_path, f"s3://{bucket}/t/", rf"s3://{bucket}/t/x\.jsonl\.zst: reading failed near line \d+ .*corrupt or truncated")


def test_a_bad_json_line_names_the_object_and_line(tmp_path, s3, bucket, docs):
    path = write_jsonl(tmp_path / "x.jsonl", text_records(docs[:20]), bad_line=7)
    s3.fs().put_file(str(path), f"{bucket}/j/x.jsonl")
    cli_refuses(tmp_path, f"s3://{bucket}/j/x.jsonl", rf"s3://{bucket}/j/x\.jsonl line 8: not valid JSON")


@pytest.mark.slow
def test_a_saved_datasets_directory_on_s3_is_refused_with_what_to_do(tmp_path, s3, bucket):
    s3.fs().pipe(f"{bucket}/hf/state.json", b'{"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}')
    s3.fs().put_file(str(SAMPLE), f"{bucket}/hf/x.parquet")
    cli_refuses(tmp_path, f"s3://{bucket}/hf/", r"saved datasets directory \(state\.json\) on object storage .*to_parquet")


def test_credentials_in_the_url_are_refused_and_not_echoed(tmp_path, s3, bucket):
    line = cli_refuses(tmp_path, f"s3://AKIAEXAMPLE:s3cr3t@{bucket}/x/", r"credentials in it.*AWS_ACCESS_KEY_ID")
    assert "s3cr3t" not in line and "AKIAEXAMPLE" not in line


# --- Planning reads O(objects), not O(bytes) ---


def planning_bytes(tmp_path: Path, s3: S3Server, url: str, name: str) -> int:
    """Bytes the S3 server sent to this process while it planned a build of ``url``."""
    proxy = CountingProxy(s3.endpoint)
    try:
        with environment({"AWS_ENDPOINT_URL": proxy.endpoint}):
            config = BuildConfig(name=name, sources=(url,), shard_tokens=1_000_000)
            plan = plan_build(config, data_root=tmp_path / name / "data", catalog=tmp_path / name / "catalog")
            assert len(plan.inputs) == 4
        return proxy.received
    finally:
        proxy.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["parquet", "jsonl.zst", "arrow"])
def test_planning_reads_a_bounded_amount_per_object_whatever_the_object_sizes(tmp_path, s3, bucket, kind):
    sizes = {}
    for mb in (1, 6):
        out = tmp_path / f"mb{mb}"
        subprocess.run(
            [sys.executable, str(MAKE_CORPUS), str(out), "--mb", str(mb), "--files", "4", "--seed", "1"], check=True
        )
        for p in sorted(out.glob("*.parquet")) if kind != "parquet" else []:
            table = pq.read_table(p, columns=["text"])
            if kind == "arrow":
                with pa.ipc.new_file(str(p.with_suffix(".arrow")), table.schema) as w:
                    w.write_table(table, max_chunksize=256)
            else:
                write_jsonl(p.with_suffix(".jsonl.zst"), text_records(table.column("text").to_pylist()))
            p.unlink()
        upload(s3, out, f"{bucket}/mb{mb}")
        sizes[mb] = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        shutil.rmtree(out)
    small = planning_bytes(tmp_path, s3, f"s3://{bucket}/mb1/", "small")
    large = planning_bytes(tmp_path, s3, f"s3://{bucket}/mb6/", "large")
    assert sizes[6] > 4 * sizes[1]
    # Six times the bytes in the same number of objects: planning reads about the same, a sliver of the corpus.
    assert large < 1.5 * small + 64_000, (small, large, sizes)
    assert large < sizes[6] / 10, (large, sizes[6])


@pytest.mark.slow
def test_a_json_lines_object_and_its_local_copy_are_cut_into_the_same_units_and_build_the_same_version(
    tmp_path, s3, bucket, docs
):
    """Units from the file and the unit size alone (``sources/cuts.py``): byte ranges at the multiples of the
    unit size, a small last one joined; an object cut there blind, a local file at the first line at or after.

    A local build of one unit is the reference for the bytes: shards, indexes, stats.json with its
    --stats-column counts; the cut ones share their own build key (the unit size is in it).
    """
    records = [json.dumps({"text": t, "src": f"s{i % 3}"}) for i, t in enumerate(docs[:120])]
    data = ("\n".join(records) + "\n").encode()
    local = tmp_path / "corpus" / "x.jsonl"
    local.parent.mkdir()
    local.write_bytes(data)
    s3.fs().pipe(f"{bucket}/fine/x.jsonl", data)
    unit_bytes = len(data) // 8  # eight ranges and a few bytes, which join the eighth
    options = dict(name="fine", val_fraction=0.2, seed=5, shard_tokens=30_000, stats_column="src")
    one = make_builder(tmp_path / "one")(local, **options)
    url = f"s3://{bucket}/fine/x.jsonl"
    plan = plan_build(BuildConfig(sources=(url,), unit_bytes=unit_bytes, **options), data_root=tmp_path / "p" / "data",
                      catalog=tmp_path / "p" / "catalog")
    # Byte ranges at the multiples of the unit size, covering the object; rows counted by their workers (-1),
    # numbered by the layout.
    assert [(u.start, u.stop) for u in plan.units] == [(k * unit_bytes, (k + 1) * unit_bytes) for k in range(7)] + [
        (7 * unit_bytes, len(data))
    ]
    assert [u.first_row for u in plan.units] == [0] + [-1] * 7 and all(u.rows == -1 for u in plan.units)
    # A local file: at the first line at or after each of them, rows counted while planning.
    lplan = plan_build(BuildConfig(sources=(str(local),), unit_bytes=unit_bytes, **options),
                       data_root=tmp_path / "lp" / "data", catalog=tmp_path / "lp" / "catalog")
    begins = [0] + [k + 1 for k, byte in enumerate(data[:-1]) if byte == ord("\n")]
    # (a range inside a line that runs past its end has no line of its own)
    firsts = sorted({begins[i] for u in plan.units if (i := bisect.bisect_left(begins, u.start)) < len(begins)})
    assert [u.start for u in lplan.units] == firsts and sum(u.rows for u in lplan.units) == len(records)
    local_fine = make_builder(tmp_path / "local")(local, unit_bytes=unit_bytes, workers=2, **options)
    remote = make_builder(tmp_path / "s3")(url, unit_bytes=unit_bytes, workers=2, **options)
    for built in (local_fine, remote):
        assert files_of(built.directory) == files_of(one.directory)
        assert (built.directory / "stats.json").read_bytes() == (one.directory / "stats.json").read_bytes()
    keys = [read_manifest(b.directory).build_key for b in (one, local_fine, remote)]
    assert keys[1] == keys[2] != keys[0]
    (entry,) = json.loads((one.directory / "stats.json").read_text())["inputs"]
    assert sorted(entry["by_column"]) == ["s0", "s1", "s2"] and entry["documents"] == len(records)
