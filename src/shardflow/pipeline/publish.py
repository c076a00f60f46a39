"""Finalizing and publishing a staged build: write the manifest, validate everything, then make it a version.

``finalize`` assembles the manifest from the stages' recorded results, adds
the statistics that the stats-card stage merged (``pipeline/card_stage.py``;
merged and drawn here if that stage's record does not match ``out/``), writes
the card's Markdown and the manifest into ``out/`` (a version of more than
``manifest.SHARD_TABLE_ABOVE`` shards with its shard table, ``shards.tsv``, schema 4) and validates every file
against it (shards, indexes, tokenizer file, embeddings); shards are not read again: each was checked as it
was written (``pipeline/check.py``), and its record is compared with its files' sizes, inodes and mtimes. ``publish``
then gives the validated directory
its identity under the dataset's catalog lock: it picks the version name,
stamps ``version`` and ``dataset_path`` (nothing else) into the manifest,
renames ``out/`` to ``<data_root>/<name>/<version>`` and adds the catalog
entry, which is the commit point. A manifest that changed between the two
steps is refused.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from .._io import atomic_write_text, fsync_dir, sha256_file
from ..card import CARD_DIR, card_wanted, stamp_card, write_card, write_card_text
from ..catalog import Catalog, VersionEntry, default_catalog, default_data_root
from ..config import EmbedOptions
from ..embed.compute import add_embeddings, check_embed_options
from ..embed.embedder import check_available
from ..embed.files import embedding_key, validate_embeddings
from ..errors import ShardflowError, ValidationError
from ..faults import fault
from ..manifest import (MANIFEST_NAME, SCHEMA_VERSION, Manifest, SplitEntry, read_manifest, shard_table_wanted,
                        write_manifest)
from ..provenance import catalog_id, claim_publisher, publisher_record, read_publisher
from ..targets.hf_tokenizer import HF_DIR
from ..tokenizers import load_tokenizer
from ..validation import validate_dir
from .card_stage import CardResult, card_done, draw_card, parent_dir
from .assemble import now
from .model import BuildPlan, BuildResult
from .staging import Staging, as_plan, discard_staging, publish_record, staging_name
from .collect_stats import collecting
from .staged import content_key, staged_manifest
from .target_files import write_target_files
from .write import write_tokenizer_files

__all__ = ["finalize", "publish", "publish_out", "embed_version"]

log = logging.getLogger("shardflow.pipeline")


def write_card_text_quietly(plan: BuildPlan, manifest: Manifest, out: Path, card: CardResult) -> None:
    """Write ``card/README.md`` beside the plots the stats-card stage drew; a failure is a warning, never a failed build."""
    try:
        write_card_text(out, manifest, card.drawn(), parent=parent_dir(plan))
    except Exception as exc:  # the card is a view of stats.json; the data is fine without it
        log.warning("%s: the dataset card could not be written (%s)", out / CARD_DIR, exc)


def finalize(plan: BuildPlan | str | os.PathLike[str]) -> Manifest:
    """Copy the tokenizer file into ``out/``, write the card's text and the manifest there, and validate the
    staged files against it."""
    plan = as_plan(plan)
    staging = Staging(plan.staging)
    tokenizer = load_tokenizer(plan.config.tokenizer, backend=plan.config.backend)
    write_tokenizer_files(tokenizer, staging.out)
    manifest = staged_manifest(plan)
    write_target_files(plan.config.target, manifest, staging.out, tokenizer)  # what its settings name (hf_tokenizer/)
    # The statistics (stats.json, named in the manifest with its SHA-256) and the card's plots: the
    # stats-card stage's, drawn beside the shard jobs; drawn here if that stage did not finish.
    card = (card_done(plan) or draw_card(plan)) if collecting(plan) else None
    if card is not None and card.stats is not None:
        manifest = manifest.replace(extra={**manifest.extra, "stats": card.stats})
        if card.card:
            write_card_text_quietly(plan, manifest, staging.out, card)
    # A writer killed mid-file (an earlier, interrupted run) leaves its temporary
    # file behind; it must not be published with the version.
    for stray in staging.out.rglob(".*.tmp-*"):  # the split directories too
        stray.unlink(missing_ok=True)
    if shard_table_wanted(manifest):
        # More than SHARD_TABLE_ABOVE shards: listed in shards.tsv (schema 4), written before the manifest that names
        # it; read back, so that the validation below checks the table too and the manifest returned names it.
        write_manifest(staging.out, manifest, shard_table=True)
        manifest = read_manifest(staging.out)
    else:
        write_manifest(staging.out, manifest, shard_table=False)
    fault("finalize-manifest", staging.out)
    # Shards checked as they were written (pipeline/check.py) are not read again here: each record against its
    # files' sizes, inodes and mtimes. If any is not (a file changed or replaced since, a staging directory of an
    # older run), every shard is validated here in full, byte for byte.
    each_checked = all(
        staging.shard_checked(split, k, entry)
        for split, s in manifest.splits.items()
        for k, entry in enumerate(s.shards)
    )
    validate_dir(staging.out, manifest, checksums=True, shards=not each_checked)
    fault("finalize-done", staging.out)
    return manifest


def publish(plan: BuildPlan | str | os.PathLike[str]) -> str:
    """Publish a finalized build staging directory as the next version; returns ``NAME@VERSION``."""
    plan = as_plan(plan)
    staging = Staging(plan.staging)
    if staging.sends:
        return _publish_sent(plan, staging)
    return publish_out(
        staging.out,
        url_root=staging.data_root_url(),
        name=plan.config.name,
        build_key=content_key(plan),
        data_root=plan.data_root,
        catalog=plan.catalog,
        cleanup=Path(plan.staging),
    )


def _publish_sent(plan: BuildPlan, staging: Staging) -> str:
    """Publish a build whose workers sent its files to a bucket (``bucket/remote_jobs.py``): the manifest names
    the version's URL as its ``dataset_path``; the bucket catalog's entry is the commit point. This staging
    directory holds records only, and goes."""
    from ..bucket.remote_jobs import discard_job_dirs, read_sends, send_version

    sends = read_sends(staging)
    assert sends is not None
    build_key = content_key(plan)
    _stamp(staging.out, sends.version, sends.version_url, build_key)
    ref, _ = send_version(staging, sends, name=plan.config.name, build_key=build_key, planned_key=plan.build_key)
    discard_job_dirs(sends)  # (this machine's; DaskExecutor discards the workers')
    discard_staging(Path(plan.staging))
    return ref


def _stamp(out: Path, version: str, final: Path | str, build_key: str) -> None:
    """Write the version's identity into the validated manifest of ``out``, and nothing else."""
    manifest = read_manifest(out)
    if manifest.build_key != build_key:
        raise ValidationError(f"{out / MANIFEST_NAME}: the manifest is not the one of build {build_key[:16]}; rebuild")
    write_manifest(out, manifest.replace(version=version, dataset_path=str(final)))
    stamp_card(out, f"{manifest.name}@{version}")


def _refuse_symlinks(out: Path) -> None:
    """A version holds no symlink: publishing one would make a later read (or a hard link) follow it anywhere."""
    for root, dirs, files in os.walk(out):
        for name in dirs + files:
            if os.path.islink(os.path.join(root, name)):
                raise ValidationError(
                    f"{os.path.join(root, name)}: a symlink in the version being published; a version's files must "
                    "be regular files inside it. Nothing was published: remove it and build again"
                )


def _seal(final: Path, manifest: Manifest, record: Path) -> str:
    """Make every file of the version read-only, and record its shard files' size, inode and mtime.

    Read-only: hard links share one inode across versions, so a write through one
    version would change them all. The record (``record``, beside the catalog; its
    SHA-256 in the catalog entry) lets an incremental build check the shards it reuses
    without reading them (``pipeline/incremental.py``). Returns that SHA-256.
    """
    stats: dict[str, list[int]] = {}
    for entry in manifest.splits.values():
        for shard in entry.shards:
            for name in (shard.file, *(f.file for f in shard.files)):
                st = os.lstat(final / name)
                stats[name] = [st.st_size, st.st_ino, st.st_mtime_ns]
    record.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(record, json.dumps({"files": stats}, sort_keys=True))
    for root, _dirs, files in os.walk(final):
        for name in files:
            path = os.path.join(root, name)
            mode = os.lstat(path).st_mode
            if mode & 0o222:
                os.chmod(path, mode & ~0o222)  # chmod changes ctime only: the recorded mtimes stay true
    return sha256_file(record)


def _own_claim(final: Path, cat: Catalog, name: str, build_key: str) -> bool:
    """Whether the publisher record of ``final`` is this catalog's claim of it for this build."""
    return read_publisher(final) == {"catalog": catalog_id(cat), "name": name, "version": final.name, "build_key": build_key}


def _choose_version(cat: Catalog, name: str, dataset_dir: Path, out: Path, build_key: str,
                    staging: Path | None) -> tuple[str, bool]:
    """The version name this publish gets, claimed (``claim_publisher``), and whether its directory is in place
    already (a publish of this build that was killed, or failed, after its rename and before its catalog entry).

    The name recorded in the staging directory ``staging``'s ``publish.json`` (``staging.publish_record``) is taken up again
    while this catalog does not list it and its publisher record is still this claim; otherwise the next name
    that no directory, trash (``.vN.removed``) or publisher record holds, for this catalog or any other that
    shares the data root. No other directory is ever adopted or stamped.
    """
    taken = {v.version for v in cat.versions(name)} | {v.version for v in cat.removed(name)}
    recorded = publish_record(Staging(staging), cat, name) if staging is not None else None
    if recorded is not None and recorded["build_key"] == build_key and recorded["version"] not in taken:
        final = dataset_dir / recorded["version"]
        if _own_claim(final, cat, name, build_key):
            if out.exists() and not final.exists():
                return final.name, False
            if not out.exists() and final.is_dir() and not final.is_symlink():
                try:
                    if read_manifest(final).build_key == build_key:
                        return final.name, True
                except ShardflowError:
                    pass
    version = cat.next_version(name)
    while True:
        final = dataset_dir / version
        free = not (final.exists() or final.is_symlink() or publisher_record(final).exists()
                    or (dataset_dir / f".{version}.removed").exists())  # (lifecycle.trash_path: an interrupted rm's)
        if free and claim_publisher(final, catalog=cat, name=name, build_key=build_key):
            return version, False
        version = f"v{int(version[1:]) + 1}"


def publish_out(
    out: Path,
    *,
    name: str,
    build_key: str,
    data_root: str | os.PathLike[str],
    catalog: str | os.PathLike[str],
    cleanup: Path | None = None,
    latest_if: str | None = None,
    url_root: str | None = None,
) -> str:
    """Publish the complete, validated version directory ``out`` (manifest inside); returns ``NAME@VERSION``.

    Under the dataset's catalog lock: pick the version name and claim it (its
    publisher record, ``.vN.publisher.json``, names this catalog; ``cleanup``'s
    ``publish.json`` records it too), stamp it into the
    manifest, rename ``out`` to ``<data_root>/<name>/<version>`` (atomic), then
    add the catalog entry (the commit point). An identical version (same build
    key) already in the catalog wins, and nothing new is published. The
    manifest's ``parent`` is what the build recorded when it was assembled.
    ``cleanup`` is removed afterwards. The new version becomes ``latest``, but with ``latest_if`` (a version
    name) only while that version is ``latest``: an embedding of an older version never moves ``latest`` back.
    ``url_root``: the data root's URL when ``data_root`` is a scratch mirror of a bucket (the manifest's
    ``dataset_path`` is then ``URL/NAME/vN``, where the version will be read).
    """
    cat = Catalog(catalog)
    out = Path(out)
    with cat.lock(name):
        existing = cat.find_build(name, build_key)
        if existing is not None:
            if cleanup is not None:
                discard_staging(cleanup)
            return f"{name}@{existing.version}"
        dataset_dir = Path(data_root) / name
        if out.exists():
            _refuse_symlinks(out)  # before anything is claimed
        # The name is claimed first (``.vN.publisher.json``: several catalogs may share the data root), and
        # recorded in the staging directory (``publish.json``) before the rename: a rerun after a publish that
        # died after its rename but before its catalog entry takes back that directory, and no other.
        version, in_place = _choose_version(cat, name, dataset_dir, out, build_key, cleanup)
        final = dataset_dir / version
        if cleanup is not None:
            record = {"catalog": catalog_id(cat), "name": name, "version": version, "build_key": build_key}
            atomic_write_text(Staging(cleanup).publish_file, json.dumps(record, sort_keys=True))
        if not in_place:
            _stamp(out, version, f"{url_root}/{name}/{version}" if url_root else final, build_key)
            fault("publish-stamped", out)
            os.replace(out, final)
            fsync_dir(dataset_dir)
            fault("publish-renamed", final)
        manifest = read_manifest(final)
        files_sha256 = _seal(final, manifest, cat.files_record(name, version))
        cat.add(
            name,
            VersionEntry(
                version=version,
                path=str(final),
                created_at=manifest.created_at,
                build_key=build_key,
                parent=manifest.parent,
                totals={k: manifest.totals[k] for k in ("documents", "tokens", "shards", "bytes")},
                manifest_sha256=sha256_file(final / MANIFEST_NAME),
                files_sha256=files_sha256,
            ),
            make_latest=latest_if is None or cat.latest(name) == latest_if,
        )
        fault("publish-cataloged", final)
    if cleanup is not None:  # the published build's staging directory (renamed, then deleted: never half of one)
        discard_staging(cleanup)
    log.info("published %s@%s at %s", name, version, final)
    return f"{name}@{version}"


def embed_version(
    ref: str,
    options: EmbedOptions,
    *,
    catalog: str | os.PathLike[str] | None = None,
    data_root: str | os.PathLike[str] | None = None,
    workers: int = 1,
) -> BuildResult:
    """Add embeddings to the published version ``ref`` as a new version whose parent is ``ref``.

    The new version gets the next number; it becomes ``latest`` only when ``ref``'s version was ``latest``
    (embedding an older version never moves ``latest`` backwards). The token shards and indexes are hard-linked from the parent (no copies;
    a copy only where the data root is on another filesystem). The embeddings
    are computed as a build's are, one part per shard, on ``workers`` threads.
    """
    cat = Catalog(default_catalog(catalog))
    given_root = default_data_root(data_root) if data_root is not None else None  # a URL: refused, before anything
    src_dir = cat.resolve(ref)
    parent = read_manifest(src_dir)
    check_embed_options(parent, options)  # before anything is staged
    check_available(options)
    key = embedding_key(parent.build_key, options)
    existing = cat.find_build(parent.name, key)
    if existing is not None:
        found = f"{parent.name}@{existing.version}"
        return BuildResult(ref=found, manifest_path=str(cat.version_dir(existing) / "metadata.yaml"), created=False)
    root = given_root or src_dir.parent.parent
    staging = root / parent.name / ".staging" / f"emb-{staging_name(key, cat)}"  # one per build and catalog
    out = staging / "out"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    names = [
        name
        for entry in parent.splits.values()
        for shard in entry.shards
        for name in (shard.file, *(f.file for f in shard.files))
    ]
    for field in ("rank_file", "tokenizer_file"):  # the tokenizer file's copy (tiktoken's key, the file families')
        if parent.tokenized_info.get(field):
            names.append(parent.tokenized_info[field])
    # The statistics describe the same tokens: linked too, so the manifest's ``stats`` section stays true.
    names += [f["file"] for f in parent.extra.get("stats", {}).get("files", [])]
    # So does the tokenizer a --target's settings name (hf_tokenizer/): without it they fall back to others.
    hf = src_dir / HF_DIR
    names += [p.relative_to(src_dir).as_posix() for p in sorted(hf.rglob("*")) if p.is_file()] if hf.is_dir() else []
    for name in names:
        (out / name).parent.mkdir(parents=True, exist_ok=True)  # a split directory (schema 2)
        try:
            os.link(src_dir / name, out / name)
        except OSError:
            shutil.copy2(src_dir / name, out / name)
    base = parent.replace(
        splits={k: SplitEntry(documents=v.documents, tokens=v.tokens, shards=v.shards, extra={}) for k, v in parent.splits.items()},
        extra={k: v for k, v in parent.extra.items() if k != "embeddings"},
        config={**parent.config, "embed": options.to_dict()},
        build_key=key,
        # The embeddings go into embeddings/, which schema 1 readers refuse; the shards stay the parent's,
        # so a schema-2 parent's (cut across inputs) keep schema 2, which no incremental build links from.
        schema_version=max(2, min(parent.schema_version, SCHEMA_VERSION)),
        created_at=now(),
        parent=parent.ref,
    )
    manifest = add_embeddings(out, base, options, workers=workers)
    problems = validate_embeddings(out, manifest)
    if problems:
        shutil.rmtree(staging, ignore_errors=True)
        raise ValidationError("\n  ".join([f"embeddings of {ref} failed validation:", *problems]))
    write_manifest(out, manifest, shard_table=shard_table_wanted(manifest))  # (the parent's table is not linked)
    if "stats" in manifest.extra and card_wanted(manifest.config):
        try:  # the card of the same tokens, against REF; a view, never a reason to fail
            write_card(out, manifest, parent=src_dir, parent_ref=ref)
        except Exception as exc:
            log.warning("%s: the dataset card could not be written (%s)", out / "card", exc)
    new_ref = publish_out(out, name=parent.name, build_key=key, data_root=root, catalog=cat.path, cleanup=staging,
                          latest_if=parent.version)
    return BuildResult(ref=new_ref, manifest_path=str(cat.resolve(new_ref) / "metadata.yaml"), created=True)
