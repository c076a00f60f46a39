"""What a build run shows in the Prefect UI: artifact keys, contents and their order.

Every ``build_dataset`` run creates three artifacts, keyed per dataset (keys from
:func:`artifact_key`), listed here in :data:`ARTIFACT_ORDER`, the order a reader meets them:

* ``<dataset>-summary``: the build in one page (:func:`summary_markdown`): the reference and where its
  ``metadata.yaml`` is, validation, tokenizer, dtype, format, totals per split, throughput over the jobs
  run in this run, one row per job found done before it (with a temporary server, the jobs the command
  ran while the server started), the commands that read the version, and its shards (the first
  :data:`SHARD_ROWS`; ``metadata.yaml`` lists all);
* ``<dataset>-card``: the dataset card (``card/README.md``) as markdown, its plots inlined as ``data:``
  URLs (the UI's browser cannot read the version's files; markdown draws them, where an image artifact
  would print its whole URL);
* ``<dataset>-progress``: a progress artifact, made as the run starts and updated as work units and
  shards finish.

Their order on a run's page: both of Prefect's UIs list a flow run's artifacts by id, newest id first
(prefect 3.9.1: the Vue UI's ``FlowRunArtifacts`` filters ``/artifacts/filter`` with no sort, so the
server's default ``ArtifactSort.ID_DESC`` applies; the React UI, ``ui-v2``, asks for ``ID_DESC``). Ids
are random (UUID4), so creation order decides nothing: each artifact is made again until its id falls in
its kind's band of the ids' range (:func:`in_place`), and the ones it replaced are deleted.

Artifact keys may hold only lowercase letters, digits and dashes, so the
dataset name is slugged (``wiki_en.v2`` becomes ``wiki-en-v2``). Because the
keys are stable per dataset, each run adds a new version of the same keys, and
the Artifacts page of the UI lists each dataset's three, their versions its builds over time.

The content builders are plain functions (no Prefect), tested on their own.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any, Callable, Sequence

from shardflow.manifest import Manifest, boundary_tokens

__all__ = [
    "artifact_key", "dataset_slug", "shard_rows", "summary_markdown", "summary_description", "manifest_markdown",
    "card_markdown", "ARTIFACT_ORDER", "in_place", "placed", "FOUND_ROWS", "SHARD_ROWS",
]

# The order a reader meets a run's artifacts in: the summary first, the progress bar (made first) last.
ARTIFACT_ORDER = ("summary", "card", "progress")
# Kinds earlier versions made too (a shard table, the manifest's place, each plot): their keys stay valid names.
_KEY_KINDS = (*ARTIFACT_ORDER, "shards", "manifest", "lengths", "sources", "shard-fill", "vs-parent")
FOUND_ROWS = 100
"""Jobs found done, at most, listed one per row in the summary (the rest counted)."""
SHARD_ROWS = 50
"""Shards, at most, listed in the summary (``metadata.yaml`` lists every one)."""


def in_place(artifact_id: uuid.UUID | str, kind: str) -> bool:
    """Whether an artifact of ``kind`` with id ``artifact_id`` sits in its place of :data:`ARTIFACT_ORDER`.

    The UIs list by id, descending. The ids' range is cut into ``len(ARTIFACT_ORDER)`` equal bands, the
    first kind's the highest: an artifact whose id lies in its kind's band comes before every later kind's,
    whatever ids those drew. A random id lands in its band with a chance of one in three, whatever the
    others' ids: a bounded number of tries (``flows.build``). The server's SQLite column holds an id as its
    hyphenated lowercase hex text, PostgreSQL as its 16 bytes: both order as the 128-bit number.
    """
    bands = len(ARTIFACT_ORDER)
    band = bands - 1 - ARTIFACT_ORDER.index(kind)
    return uuid.UUID(str(artifact_id)).int * bands >> 128 == band


def placed(create: Callable[[], Any], kind: str, tries: int = 40) -> tuple[Any, list[Any]]:
    """Call ``create()`` (it makes an artifact of ``kind`` and returns its id) until the id is :func:`in_place`.

    The id kept and the ones it replaced, for the caller to delete. Each try lands with a chance of one in
    three, so ``tries=40`` misses once in 10^7 (the last one is kept then: the order is a convenience).
    """
    made, replaced = create(), []
    while not in_place(made, kind) and len(replaced) < tries:
        replaced.append(made)
        made = create()
    return made, replaced


def dataset_slug(name: str) -> str:
    """A dataset name as an artifact key part: lowercase letters, digits and single dashes."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return slug or "dataset"


def artifact_key(name: str, kind: str) -> str:
    """``<dataset slug>-<kind>``, e.g. ``artifact_key("wiki_en", "summary") == "wiki-en-summary"``."""
    if kind not in _KEY_KINDS:
        raise ValueError(f"unknown artifact kind {kind!r}; one of {', '.join(_KEY_KINDS)}")
    return f"{dataset_slug(name)}-{kind}"


def shard_rows(manifest: Manifest) -> list[dict[str, Any]]:
    """One row per shard, in manifest order: the summary's shard table (its first :data:`SHARD_ROWS`)."""
    rows = []
    for split, entry in manifest.splits.items():
        for shard in entry.shards:
            rows.append(
                {
                    "split": split,
                    "file": shard.file,
                    "tokens": shard.tokens,
                    "documents": shard.documents,
                    "bytes": shard.bytes,
                    "sha256": shard.sha256,
                }
            )
    return rows


def _data_url(path: Path) -> str:
    import base64

    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def card_markdown(directory: str | Path) -> str | None:
    """The version's ``card/README.md`` with its relative PNG links replaced by ``data:`` URLs (None: no card)."""
    card = Path(directory) / "card"
    if not (card / "README.md").is_file():
        return None
    text = (card / "README.md").read_text(encoding="utf-8")
    return re.sub(
        r"\]\(([A-Za-z0-9_]+\.png)\)",
        lambda m: f"]({_data_url(card / m.group(1))})" if (card / m.group(1)).is_file() else m.group(0),
        text,
    )


def manifest_markdown(manifest_path: str | Path, ref: str, catalog: str | Path | None) -> str:
    """Where the version's manifest is, and the commands that read it: text a reader can copy."""
    return "\n".join([f"# Manifest of {ref}", "", *_read_it(manifest_path, ref, catalog)])


def _read_it(manifest_path: str | Path, ref: str, catalog: str | Path | None) -> list[str]:
    import shlex

    path = Path(manifest_path).resolve()
    cat = f" --catalog {shlex.quote(str(Path(catalog).resolve()))}" if catalog is not None else ""
    return [
        f"`{path}`",
        "",
        "On the machine (or shared filesystem) that holds the version:",
        "",
        "```",
        f"shardflow show {ref}{cat}",
        f"shardflow validate {ref}{cat}",
        f"cat {shlex.quote(str(path))}",
        "```",
        "",
    ]


def _cell(text: Any) -> str:
    """Text for a markdown table cell: a '|' would end the cell, so it is escaped."""
    return str(text).replace("|", "\\|")


def _n(x: Any) -> str:
    return f"{x:,}" if isinstance(x, int) else str(x)


def _rate(tokens: int, seconds: float | None) -> str:
    if not seconds or seconds <= 0 or tokens <= 0:
        return "n/a"
    return f"{tokens / seconds:,.0f} tokens/s"


def summary_description(manifest: Manifest, *, created: bool) -> str:
    """One line for the artifact card on the flow run page."""
    t = manifest.totals
    head = f"{manifest.ref}" + ("" if created else " (unchanged, no new version)")
    return (
        f"{head}: {_n(t['shards'])} shards, {_n(t['tokens'])} tokens, {_n(t['documents'])} documents; "
        f"validation passed"
    )


def summary_markdown(
    manifest: Manifest,
    *,
    manifest_path: str | Path,
    created: bool,
    seconds: float | None = None,
    tokenize_seconds: float | None = None,
    units: int | None = None,
    runner: str = "threads",
    input_bytes: int | None = None,
    tokenized_tokens: int | None = None,
    units_found: int = 0,
    found: Sequence[tuple[str, str, int | None]] = (),
    found_jobs: int | None = None,
    catalog: str | Path | None = None,
) -> str:
    """The run's markdown summary.

    ``tokenized_tokens``: the tokens of the work units run in this run, over ``tokenize_seconds`` (from their
    start to the last one's end); ``units_found`` of the ``units`` were found done, and count in no rate.
    ``found``: ``(step, job, tokens)`` of the jobs found done (the first :data:`FOUND_ROWS` are listed),
    ``found_jobs`` of them in all. ``catalog``: the commands that read the version name it.
    """
    t = manifest.totals
    ti = manifest.tokenized_info
    fmt = manifest.format
    b = manifest.boundary
    status = (
        f"Published **`{manifest.ref}`**" + (f" (parent `{manifest.parent}`)" if manifest.parent else " (first version)")
        if created
        else f"**No new version**: the inputs and options are unchanged since **`{manifest.ref}`**"
    )
    lines = [
        f"# Build summary: {manifest.name}",
        "",
        status + ".",
        "",
        f"| Published reference | `{manifest.ref}` |",
        "|---|---|",
        f"| Manifest | `{Path(manifest_path)}` |",
        f"| Validation | passed: {_n(t['shards'])} shards and their indexes match the manifest (sizes, SHA-256) |",
        f"| Tokenizer | `{ti['tokenizer']}` ({ti.get('backend', '?')} backend), vocab {_n(ti['vocab_size'])} |",
        f"| dtype | `{manifest.dtype}` |",
        f"| Format | `{fmt['name']}` (header {fmt.get('header_bytes', 0)} bytes, files `{fmt.get('file_pattern', '')}`) |",
        f"| Boundary | {_boundary_cell(b)} |",
        f"| Build key | `{manifest.build_key[:16]}` |",
        f"| Created | {manifest.created_at} |",
        "",
        "## Totals",
        "",
        "| split | documents | tokens | shards |",
        "|---|---:|---:|---:|",
    ]
    for split, entry in manifest.splits.items():
        lines.append(f"| {split} | {_n(entry.documents)} | {_n(entry.tokens)} | {_n(len(entry.shards))} |")
    lines += [
        f"| **total** | **{_n(t['documents'])}** | **{_n(t['tokens'])}** | **{_n(t['shards'])}** |",
        "",
        f"Input: {_n(len(manifest.inputs))} files, {_n(t['input_rows'])} rows "
        f"({_n(t['null_texts'])} null and {_n(t['empty_texts'])} empty texts skipped, "
        f"{_n(t.get('invalid_utf8', 0))} with invalid UTF-8). Output: {_n(t['bytes'])} bytes.",
        "",
        "## Throughput",
        "",
    ]
    if created:
        # Rates over the work run in this run only: what was found done took none of its time.
        new_tokens = t["tokens"] if tokenized_tokens is None else tokenized_tokens
        lines += [
            "| step | time | rate |",
            "|---|---:|---:|",
        ]
        if tokenize_seconds is not None:
            if units is not None and units_found:
                unit_part = f" ({_n(units - units_found)} of {_n(units)} work units; {_n(units_found)} found done)"
            else:
                unit_part = f" ({_n(units)} work units)" if units is not None else ""
            lines.append(f"| tokenize{unit_part} | {tokenize_seconds:.1f} s | {_rate(new_tokens, tokenize_seconds)} |")
        if seconds is not None:
            mb = (f", {input_bytes / seconds / 1e6:,.1f} MB/s of input"
                  if input_bytes and seconds > 0 and not units_found else "")
            lines.append(f"| this run | {seconds:.1f} s | {_rate(new_tokens, seconds)}{mb} |")
        lines += ["", f"Task runner: `{runner}`."]
        if tokenized_tokens is not None and tokenized_tokens != t["tokens"]:
            elsewhere = []
            if units_found:
                elsewhere.append(f"{_n(units_found)} work unit(s) found done (below)")
            if manifest.parent:
                elsewhere.append(f"`{manifest.parent}`, unchanged")
            lines += [
                "",
                f"{_n(tokenized_tokens)} tokens were tokenized in this run; the other "
                f"{_n(t['tokens'] - tokenized_tokens)} came from {' and '.join(elsewhere) or 'earlier work'}.",
            ]
    else:
        lines.append("Nothing was tokenized: this run found the identical version already published.")
    if found:
        lines += _found_lines(found, len(found) if found_jobs is None else found_jobs)
    lines += ["", "## Read it", "", *_read_it(manifest_path, manifest.ref, catalog)]
    rows = shard_rows(manifest)
    lines += ["## Shards", "", "| split | file | tokens | documents | bytes | sha256 |", "|---|---|---:|---:|---:|---|"]
    lines += [f"| {r['split']} | `{r['file']}` | {_n(r['tokens'])} | {_n(r['documents'])} | {_n(r['bytes'])} "
              f"| `{r['sha256']}` |" for r in rows[:SHARD_ROWS]]
    if len(rows) > SHARD_ROWS:
        lines += ["", f"The first {SHARD_ROWS} of {_n(len(rows))} shards; `metadata.yaml` lists every one."]
    return "\n".join(lines) + "\n"


def _found_lines(found: Sequence[tuple[str, str, int | None]], jobs: int) -> list[str]:
    """The summary's section on the jobs found done: one row each (the first :data:`FOUND_ROWS`)."""
    lines = [
        "",
        "## Done before this run",
        "",
        f"{_n(jobs)} job{'s' * (jobs != 1)} were found done when this run reached them, and took no task run: run by "
        "this command while Prefect's temporary server started, or by an earlier run of this build that stopped "
        "(a shard linked unchanged from the parent needs no new check). Their tokens are in no rate above.",
        "",
        "| step | job | tokens |",
        "|---|---|---:|",
    ]
    lines += [f"| {_cell(step)} | {_cell(job)} | {'' if tokens is None else _n(tokens)} |"
              for step, job, tokens in found[:FOUND_ROWS]]
    if jobs > min(len(found), FOUND_ROWS):
        lines.append(f"| | {_n(jobs - min(len(found), FOUND_ROWS))} more | |")
    return lines


def _boundary_cell(section: dict) -> str:
    """``<|endoftext|>`` = 100257 (bos), or each placed token: BOS `<|x|>` = 1, EOS `<|y|>` = 2 (both)."""
    return boundary_tokens(section).describe(lambda text: f"`{_cell(text)}`")
