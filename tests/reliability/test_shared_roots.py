"""Trust when roots are shared (issue 40, cases 1, 2 and 4).

Several catalogs over one local data root each keep their own versions: a build
adopts, moves or restamps only a directory its own interrupted publish left
(the staging directory's ``publish.json`` and the version's publisher record,
``.vN.publisher.json``, both name its catalog), and ``rm``/``gc`` from one
catalog never touch another's. A version opened by path is checked against the
catalog that published it, found by that record; one that no catalog lists
fails ``validate`` unless ``--standalone``, and readers serve it with one
warning. ``NAME@REF`` always goes through the catalog, never a folder of that
name.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from pathlib import Path

import pytest
import yaml

from support.cli import run_main
from support.corpus import TINY_TEXTS, write_parquet
from shardflow import faults
from shardflow.catalog import Catalog
from shardflow.config import BuildConfig
from shardflow.errors import ShardflowError, ValidationError
from shardflow.lifecycle import collect_garbage, remove_version
from shardflow.manifest import read_manifest
from shardflow.pipeline import build
from shardflow.reader import open_version
from shardflow.runtime import open_shards

NAME = "wiki"


@pytest.fixture
def corpora(tmp_path: Path) -> dict[str, Path]:
    """Three tiny corpora (other texts, so other build keys)."""
    return {
        "c1": write_parquet(tmp_path / "c1" / "a.parquet", TINY_TEXTS),
        "c2": write_parquet(tmp_path / "c2" / "a.parquet", TINY_TEXTS[::-1]),
        "c3": write_parquet(tmp_path / "c3" / "a.parquet", [*TINY_TEXTS, "more"]),
    }


def publish(corpus: Path, data: Path, catalog: Path, vocab: Path, name: str = NAME) -> str:
    """Build ``corpus`` as ``name`` (no statistics, no card: the card's plots would be most of the time)."""
    config = BuildConfig(name=name, sources=(str(corpus),), tokenizer=str(vocab), stats=False)
    return build(config, data_root=data, catalog=catalog).ref


def validated(ref: str, catalog: Path) -> str:
    status, out, err = run_main("validate", ref, "--catalog", catalog)
    assert status == 0, out + err
    return out.splitlines()[0]


def listed(catalog: Path) -> list[str]:
    return [v.version for v in Catalog(catalog).versions(NAME)]


# --- case 1: two catalogs over one data root -------------------------------------------------------------

def test_catalogs_sharing_a_data_root_keep_their_own_versions_and_gc_of_one_never_touches_another(
    tmp_path, corpora, small_vocab, monkeypatch
):
    data, cat_a, cat_b, cat_c = (tmp_path / d for d in ("data", "catA", "catB", "catC"))
    assert publish(corpora["c2"], data, cat_b, small_vocab) == "wiki@v1"
    assert remove_version("wiki@v1", catalog=cat_b).ref == "wiki@v1"  # B's v1 is gone: its name may be A's now
    assert publish(corpora["c1"], data, cat_a, small_vocab) == "wiki@v1"  # A's v1, where B's v1 was
    a_v1 = read_manifest(data / NAME / "v1")
    # B builds A's corpus: A's v1 (unlisted in B, same build key) is not B's to adopt; B gets v2 of its own.
    assert publish(corpora["c1"], data, cat_b, small_vocab) == "wiki@v2"
    # An empty catalog C builds it too: A's v1 is neither moved nor restamped.
    assert publish(corpora["c1"], data, cat_c, small_vocab) == "wiki@v3"
    # A's publish of c2 dies after its rename, before its catalog entry: an unlisted v4 that only A may take back.
    faults.reset()
    monkeypatch.setenv(faults.ENV, "enospc:publish-renamed")
    with pytest.raises((OSError, ShardflowError)):
        publish(corpora["c2"], data, cat_a, small_vocab)
    monkeypatch.delenv(faults.ENV)
    assert (data / NAME / "v4").is_dir() and listed(cat_a) == ["v1"]
    assert publish(corpora["c2"], data, cat_c, small_vocab) == "wiki@v5"  # C steps past A's orphan
    # gc from B: B's removed v1 is A's live version now, A's staging and orphan are A's: nothing of A's goes.
    collect_garbage(data_root=data, catalog=cat_b)
    assert remove_version("wiki@v1", catalog=cat_b).left is False  # a rerun of B's finished rm touches nothing
    assert publish(corpora["c2"], data, cat_a, small_vocab) == "wiki@v4"  # A's rerun takes back its own orphan
    assert (listed(cat_a), listed(cat_b), listed(cat_c)) == (["v1", "v4"], ["v2"], ["v3", "v5"])
    assert read_manifest(data / NAME / "v1").to_dict() == a_v1.to_dict()
    for ref, cat in (("wiki@v1", cat_a), ("wiki@v4", cat_a), ("wiki@v2", cat_b), ("wiki@v3", cat_c), ("wiki@v5", cat_c)):
        assert validated(ref, cat).startswith(f"OK {ref}:")
    # gc from A, after B's rm of its v2: A removes nothing of B's, C's or its own.
    remove_version("wiki@v2", catalog=cat_b)
    assert collect_garbage(data_root=data, catalog=cat_a) == []
    assert all((data / NAME / v).is_dir() for v in ("v1", "v3", "v4", "v5")) and not (data / NAME / "v2").exists()


# --- case 2: a version opened by path is checked against the catalog that published it ------------------

def forge(directory: Path) -> None:
    """Rewrite a shard's tokens and the manifest's SHA-256 of it to match (as someone who can write the data root)."""
    manifest = directory / "metadata.yaml"
    data = yaml.safe_load(manifest.read_text())
    entry = data["splits"]["train"]["shards"][0]
    shard = directory / entry["file"]
    forged = bytearray(shard.read_bytes())
    forged[-4:-2] = (1).to_bytes(2, "little")  # a valid id, in place of the last document's last token
    for path in (shard, manifest):
        path.chmod(0o644)
    shard.write_bytes(bytes(forged))
    entry["sha256"] = hashlib.sha256(bytes(forged)).hexdigest()
    manifest.write_text(yaml.safe_dump(data, sort_keys=False))


def test_a_version_opened_by_path_is_checked_against_the_catalog_that_published_it(
    tmp_path, corpora, small_vocab, monkeypatch, caplog
):
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    elsewhere.mkdir()
    publish(corpora["c1"], root / "data", root / "catalog", small_vocab)
    v1 = root / "data" / NAME / "v1"
    monkeypatch.chdir(elsewhere)  # the default catalog, ./manifests, does not list it
    assert run_main("validate", v1)[1].startswith("OK wiki@v1")  # found through its publisher record
    copy = elsewhere / "received"  # a version received from elsewhere: no catalog lists it
    shutil.copytree(v1, copy)
    # Forged in place: the shard and the manifest's SHA-256 of it rewritten to match.
    forge(v1)
    status, out, err = run_main("validate", v1)
    assert status != 0 and "OK" not in out and "the manifest was changed after wiki@v1 was published" in err, out + err
    with pytest.raises(ValidationError, match=r"the manifest was changed after wiki@v1 was published"):
        open_shards(str(v1))
    # The copy: validate says which catalogs it looked at, and checks it alone only with --standalone.
    status, out, err = run_main("validate", copy)
    assert status != 0 and "no catalog lists this version directory" in err, out + err
    assert str(elsewhere / "manifests") in err and "--standalone" in err
    status, out, err = run_main("validate", copy, "--standalone")
    assert status == 0 and out.startswith("OK wiki@v1") and "no catalog lists" in err, out + err
    with caplog.at_level(logging.WARNING, logger="shardflow.reader"):
        served = [open_shards(str(copy)).num_tokens for _ in range(2)]  # served, warned about once
    # Counted over the lines that say it: other loggers may warn meanwhile (a loaded machine's slow-path notes).
    assert served[0] > 0 and sum(r.getMessage().count("no catalog lists") for r in caplog.records) == 1, caplog.text


# --- case 4: NAME@REF always goes through the catalog -------------------------------------------------

def test_a_folder_named_like_a_reference_is_never_read_for_it(tmp_path, corpora, small_vocab, monkeypatch, caplog):
    data, catalog = tmp_path / "data", tmp_path / "catalog"
    publish(corpora["c1"], data, catalog, small_vocab)
    publish(corpora["c2"], tmp_path / "other", tmp_path / "other-catalog", small_vocab, name="evil")
    evil = tmp_path / "other" / "evil" / "v1"
    shutil.copytree(evil, data / "wiki@latest")  # planted in the data root, where the job runs
    monkeypatch.chdir(data)
    monkeypatch.setenv("SHARDFLOW_CATALOG", str(catalog))
    assert open_version("wiki@latest").ref == "wiki@v1"
    assert open_shards("wiki@latest").num_tokens == open_version("wiki@v1").split("train").num_tokens
    status, out, err = run_main("validate", "wiki@latest")
    assert status == 0 and out.startswith("OK wiki@v1"), out + err
    with caplog.at_level(logging.WARNING, logger="shardflow.reader"):
        assert open_version("./wiki@latest").ref == "evil@v1"  # the folder, asked for as one (no catalog lists it)
