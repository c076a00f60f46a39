"""The catalog's read-only commands: ``validate``, ``ls``, ``show``, ``diff``.

They read published versions through the core (``shardflow.catalog``,
``shardflow.reader``) and never import Prefect, so they answer in a fraction of
a second. ``cli.commands`` registers them in its ``COMMANDS``; errors are
``ShardflowError``s, which the command line turns into one message and exit 2.
They read a bucket's versions through the runtime's verified cache
(``shardflow.runtime.remote``: ``show`` and ``diff`` fetch only what they print). ``show``'s report on a
split is the runtime's (``shardflow.runtime.inspect``), what ``inspect_version`` returns.
The commands that change versions (``rm``, ``gc``, ``push``) are ``cli.lifecycle``.
Both check their own URLs (``BUCKET_COMMANDS``).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from shardflow.errors import ShardflowError

__all__ = ["cmd_validate", "cmd_ls", "cmd_show", "cmd_diff", "BUCKET_COMMANDS", "counted"]

BUCKET_COMMANDS = frozenset({"rm", "gc", "validate", "ls", "diff", "show", "push"})
"""Commands that take s3:// URLs as --data-root and --catalog and check them themselves (the others refuse URLs)."""


def counted(n: Any, noun: str) -> str:
    """``n`` with thousands separators and ``noun`` in the right number: ``1 shard``, ``148,378 tokens`` (the one
    way every command prints a count; ``?`` for one an older catalog lacks)."""
    if not isinstance(n, int) or isinstance(n, bool):
        return f"? {noun}s"
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def cmd_validate(args: argparse.Namespace) -> int:
    import sys

    from shardflow.catalog import asked_name_problem, resolve_version
    from shardflow.provenance import vouch_for
    from shardflow.errors import ValidationError
    from shardflow.manifest import read_manifest
    from shardflow.runtime.remote import fetch_version, is_remote_ref
    from shardflow.validation import validate_dir

    from shardflow.cli.progress import CheckProgress
    from shardflow.runtime.remote import FETCH_WORKERS, REPAIR_COMMAND

    catalog = args.catalog or os.environ.get("SHARDFLOW_CATALOG")
    workers = getattr(args, "workers", None)
    progress = CheckProgress(f"validate {args.ref}")
    if is_remote_ref(args.ref, catalog):
        # On a bucket: every object streamed from the bucket again, whatever the cache holds, and hashed against
        # the manifest's SHA-256 as it arrives (the manifest against the bucket catalog's entry): the bucket is
        # what is validated. The verified copies replace the cache's; then the same checks as a local version's.
        try:
            url, directory, manifest = fetch_version(args.ref, catalog=catalog, verify=not args.no_checksums,
                                                     refetch=not args.no_checksums, workers=workers or FETCH_WORKERS,
                                                     progress=progress.phase("fetched"))
        except ValidationError as exc:  # a damaged object: the repair command, for this version and catalog
            if "@" not in str(args.ref) or catalog is None or REPAIR_COMMAND not in str(exc):
                raise
            raise ValidationError(str(exc).replace(
                REPAIR_COMMAND, f"shardflow push {args.ref} --repair --catalog {catalog.rstrip('/')}")) from None
        report = validate_dir(directory, manifest, checksums=False, workers=workers,
                              progress=progress.phase("checked", "shards"))
        shown: Any = url
    else:
        from shardflow.cli.options import check_local_paths

        check_local_paths(args)  # a gs:// catalog, say: refused, as by the other commands
        directory, asked = resolve_version(args.ref, args.catalog)  # NAME@REF: the catalog's, never a folder
        manifest = read_manifest(directory)
        standalone = getattr(args, "standalone", False)
        if standalone and (vouch := vouch_for(directory, manifest, args.catalog)).catalog is None:
            print(f"note: {vouch.unlisted(directory)}; --standalone: its files are checked against its own manifest "
                  "only", file=sys.stderr)
        # A path is checked against the catalog that published it; one that no catalog lists fails, unless --standalone.
        report = validate_dir(directory, manifest, checksums=not args.no_checksums, published=True, catalog=args.catalog,
                              standalone=standalone, workers=workers, progress=progress.phase("checked", "shards"))
        wrong = asked_name_problem(asked, manifest, directory)  # (the catalog's entry says so first, if it lists it)
        if wrong:
            raise ValidationError(wrong)
        shown = directory
    if args.for_target is not None:  # before "OK": a version the trainer cannot load is not OK for it
        from shardflow.cli.targets import check_target

        check_target(args.for_target, directory, manifest)
    fmt = manifest.format
    print(f"OK {manifest.ref}: {counted(report.shards, 'shard')}, {counted(report.tokens, 'token')}, "
          f"{counted(report.documents, 'document')}")
    print("settings for a training job:")
    print(f"  path:          {shown}")
    print(f"  file pattern:  {fmt.get('file_pattern')}")
    print(f"  format:        {fmt['name']} (header {fmt.get('header_bytes', 0)} bytes)")
    print(f"  dtype:         {manifest.dtype}")
    print(f"  vocab_size:    {manifest.tokenized_info['vocab_size']}")
    print(f"  boundary:      {manifest.boundary_tokens.describe()}")
    for split, entry in manifest.splits.items():
        print(f"  {split:6s}         {counted(len(entry.shards), 'shard')}, {counted(entry.tokens, 'token')}, "
              f"{counted(entry.documents, 'document')}")
    if args.for_target is not None:
        from shardflow.cli.targets import print_target_settings

        print_target_settings(args.for_target, directory, manifest)
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    import posixpath
    import tempfile
    from pathlib import Path

    from shardflow.catalog import Catalog
    from shardflow.runtime.remote_store import is_remote, mirror_catalog, renamed

    url = args.catalog or os.environ.get("SHARDFLOW_CATALOG") or ""
    if not is_remote(url):
        from shardflow.cli.options import check_local_paths

        check_local_paths(args)  # a gs:// catalog, say: refused, as by the other commands
        cat = Catalog(args.catalog)
        return _ls(args, cat, str(cat.path), lambda v: str(cat.version_dir(v)))
    # A catalog in a bucket: its files read into a scratch copy, paths shown as the bucket's URLs.
    scheme, _, base = url.rstrip("/").partition("://")
    with tempfile.TemporaryDirectory(prefix="shardflow-ls-") as tmp:
        cat = mirror_catalog(url, Path(tmp))
        try:
            return _ls(args, cat, url.rstrip("/"), lambda v: f"{scheme}://{posixpath.normpath(posixpath.join(base, v.path))}")
        except ShardflowError as exc:
            raise renamed(exc, Path(tmp), url.rstrip("/")) from None


def _ls(args: argparse.Namespace, cat: Any, shown: str, where: Any) -> int:
    """``shardflow ls`` of ``cat``, named ``shown``; ``where(entry)``: a version's directory or URL."""
    if args.name is None:
        names = cat.datasets()
        if not names:
            print(f"no datasets in {shown}")
        for name in names:
            versions = cat.versions(name)
            print(f"{name}\t{len(versions)} version{'s' if len(versions) != 1 else ''}\tlatest {cat.latest(name)}")
        return 0
    if args.name not in cat.datasets():
        raise ShardflowError(f"no dataset {args.name!r} in the catalog {shown}")
    latest = cat.latest(args.name)
    for v in cat.versions(args.name):
        mark = "*" if v.version == latest else " "
        t = v.totals
        print(
            f"{mark} {args.name}@{v.version}\t{v.created_at}\t{counted(t.get('documents'), 'doc')}\t"
            f"{counted(t.get('tokens'), 'token')}\t{counted(t.get('shards'), 'shard')}\tparent {v.parent or '-'}\t{where(v)}"
        )
    return 0


def _print_embeddings(m: Any) -> None:
    info = m.extra.get("embeddings")
    if not info:
        return
    # Here, not above: its codecs need ml_dtypes, which the runtime-only install lacks (and needs for no other version).
    from shardflow.embed.files import embedding_parts

    print(f"  embeddings: {info['model']} ({info['dim']} dims, {info['precision']}, {info['long_docs']} long documents), "
          f"codec {info['codec']}; floors: mean cosine >= {info['floors']['min_mean_cosine']}, "
          f"recall@10 >= {info['floors']['min_recall_at_10']}")
    pca = info.get("pca")
    if pca:
        print(f"  PCA: {pca['input_dim']} -> {pca['dim']} dims, explained variance {pca['explained_variance_ratio']:.4f} "
              f"(fitted on {pca['sample_rows']} {pca['fit_split']} rows; {pca['mean']['file']}, {pca['components']['file']}); "
              f"floors: mean cosine >= {pca['floors']['min_mean_cosine']}, recall@10 >= {pca['floors']['min_recall_at_10']}")
    for split, entry in m.splits.items():
        section = entry.extra.get("embeddings")
        if not section:
            continue
        q = section.get("quality") or {}
        quality = (f"mean cosine {q['mean_cosine']:.5f}, min cosine {q['min_cosine']:.5f}, "
                   f"recall@{q['k']} {q['recall_at_k']:.3f} on {counted(q['rows'], 'row')}") if q else "quality not measured"
        parts = embedding_parts(section)
        where = parts[0]["file"] if len(parts) == 1 else f"{len(parts)} files (one per shard)"
        print(f"    {split}: {counted(section['rows'], 'row')} in {where} ({counted(section['bytes'], 'byte')}; "
              f"{section['truncated']:,} truncated); {'codec ' if pca else ''}{quality}")
        p = section.get("pca_quality")
        if p:
            print(f"      after the PCA, against float32 in {pca['input_dim']} dims: reconstruction mean cosine "
                  f"{p['mean_cosine']:.5f} (min {p['min_cosine']:.5f}), recall@{p['k']} {p['recall_at_k']:.3f} "
                  f"in the reduced space ({p['recall_at_k_reconstructed']:.3f} among reconstructions)")


def cmd_show(args: argparse.Namespace) -> int:
    from shardflow.card import CARD_DIR, CARD_NAME
    from shardflow.reader import open_version
    from shardflow.runtime.inspect import remote_report_split
    from shardflow.runtime.remote import is_remote_ref, remote_version
    from shardflow.stats import read_stats

    catalog = args.catalog or os.environ.get("SHARDFLOW_CATALOG")
    if is_remote_ref(args.ref, catalog):
        # On a bucket: the manifest, then only what the report reads (each file verified as it arrives): the
        # statistics, and the indexes and shards its samples come from (every index of a split of few shards).
        cache, m = remote_version(args.ref, catalog=catalog)
        _check_split(args, m)
        shards, stats = remote_report_split(cache, m, args.split or "train")
        # The card is pushed with the version (not named in its manifest) wherever it has statistics.
        card = f"{cache.url}/{CARD_DIR}/{CARD_NAME}" if stats is not None else None
        return _show(args, m, where=cache.url, card=card, shards=shards, stats=stats)
    from shardflow.cli.options import check_local_paths

    check_local_paths(args)  # a gs:// catalog, say: refused, as by the other commands
    version = open_version(args.ref, catalog=args.catalog)
    m = version.manifest
    _check_split(args, m)
    card = version.directory / CARD_DIR / CARD_NAME
    # The opened version's own shard set: its manifest is read once, and its files checked as they are read.
    return _show(args, m, where=str(version.directory), card=str(card) if card.is_file() else None,
                 shards=version.split(args.split or "train").shards, stats=read_stats(version.directory, m))


def _check_split(args: argparse.Namespace, m: Any) -> None:
    if args.split and args.split not in m.splits:  # checked before anything is printed
        raise ShardflowError(f"{m.ref} has no split {args.split!r}; give --split one of {', '.join(m.splits)}")


def _show(args: argparse.Namespace, m: Any, *, where: str, card: str | None, shards: Any, stats: Any) -> int:
    """``shardflow show`` of the version ``m`` at ``where`` (a directory or a URL): ``card`` (None: it has none),
    ``shards`` (the ``ShardSet`` of the split shown), ``stats`` (its statistics, or None)."""
    from shardflow.runtime.inspect import LENGTHS_HEADING, split_report
    from shardflow.stats import summary_lines

    if args.card:
        if card is None:
            raise ShardflowError(f"{where}: {m.ref} has no dataset card (built before statistics, or with --no-stats)")
        print(card)
        return 0
    print(f"{m.ref}  ({where})")
    if m.description:
        print(f"  {m.description}")
    print(f"  created {m.created_at}, parent {m.parent or '-'}")
    print(f"  tokenizer {m.tokenized_info['tokenizer']} ({m.tokenized_info.get('backend')}), dtype {m.dtype}, "
          f"vocab {m.tokenized_info['vocab_size']:,}, format {m.format_name}")
    print(f"  boundary {m.boundary_tokens.describe()}")
    t = m.totals
    print(f"  totals: {counted(t['documents'], 'document')}, {counted(t['tokens'], 'token')}, "
          f"{counted(t['shards'], 'shard')}, {counted(t['bytes'], 'byte')}; {counted(t['input_rows'], 'input row')}, "
          f"{t['null_texts']:,} null, {t['empty_texts']:,} empty")
    for split, entry in m.splits.items():
        print(f"  {split}: {counted(entry.documents, 'document')}, {counted(entry.tokens, 'token')} in "
              f"{counted(len(entry.shards), 'shard')}")
    _print_embeddings(m)
    split = args.split or "train"
    # From the manifest and the statistics: of the shards, only those the samples come from are read.
    report = split_report(shards, m.splits[split], split=split, samples=args.samples, stats=stats)
    if stats is not None:
        if LENGTHS_HEADING in report:
            # The report's length histogram has exact octave rows (from the document index, or the statistics for a
            # split of many shards); the statistics' summary gives quarter-octave bounds (p50 <= 2,047). Printed once.
            stats = {**stats, "splits": {}}
        print("\n".join(summary_lines(stats)))
        if card is not None:
            print(f"  card: {card}")
    print(report)
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    from shardflow.diff import diff_versions, format_diff
    from shardflow.reader import open_version

    from shardflow.runtime.remote import is_remote_ref, remote_version

    catalog = args.catalog or os.environ.get("SHARDFLOW_CATALOG")

    def manifest(ref: str) -> Any:
        if is_remote_ref(ref, catalog):  # on a bucket: its manifest alone is read, none of its shards
            return remote_version(ref, catalog=catalog)[1]
        from shardflow.cli.options import check_local_paths

        check_local_paths(args)  # a gs:// catalog, say: refused, as by the other commands
        return open_version(ref, catalog=args.catalog).manifest

    print("\n".join(format_diff(diff_versions(manifest(args.ref_a), manifest(args.ref_b)), all_inputs=args.all)))
    return 0
