"""What a build run shows in the Prefect UI: artifact keys, contents and their order.

Every ``build_dataset`` run creates, per dataset (keys from :func:`artifact_key`),
listed here in :data:`ARTIFACT_ORDER`, the order a reader meets them, summary first:

* ``<dataset>-summary``: a markdown summary (reference, manifest path, validation, tokenizer,
  dtype, format, totals per split, throughput);
* ``<dataset>-shards``: a table of the version's shards (split, file, tokens, documents, bytes, sha256);
* ``<dataset>-manifest``: where the version's ``metadata.yaml`` is, and the commands that read it
  (markdown: a ``file://`` link opens nothing from the UI's browser);
* ``<dataset>-card``: the dataset card (``card/README.md``) as markdown, its plots inlined;
* ``<dataset>-lengths``, ``-sources``, ``-shard-fill`` and (with a parent) ``-vs-parent``:
  each plot of the card (``card/*.png``) on its own, as markdown that shows the PNG inlined
  as a ``data:`` URL (the UI's browser cannot read the version's files). Not image
  artifacts: the UI prints an image artifact's whole URL, here tens of kilobytes of base64;
* ``<dataset>-progress``: a progress artifact, made as the run starts and updated as work
  units and shards finish.

The flow creates them one after another, last first (:func:`creation_order`), so that
the server's newest-first listing (``sort: CREATED_DESC``: the UI's "Created" order) is
:data:`ARTIFACT_ORDER`. The run's own Artifacts tab lists them as the server's default
sort returns them, by random id: no order a client can fix.

Artifact keys may hold only lowercase letters, digits and dashes, so the
dataset name is slugged (``wiki_en.v2`` becomes ``wiki-en-v2``). Because the
keys are stable per dataset, each run adds a new version of the same keys, and
the Artifacts page of the UI lists a dataset's builds over time.

The content builders are plain functions (no Prefect), tested on their own.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from shardflow.manifest import Manifest, boundary_tokens

__all__ = [
    "artifact_key", "dataset_slug", "shard_rows", "summary_markdown", "summary_description", "manifest_markdown", "card_plots",
    "card_markdown", "ARTIFACT_ORDER", "creation_order",
]

# The card's plots, as image artifacts: (artifact kind, PNG in card/, what it shows).
CARD_IMAGES = (
    ("lengths", "lengths.png", "document-length histogram per split (log scale)"),
    ("sources", "tokens_by_source.png", "tokens by source"),
    ("shard-fill", "shard_fill.png", "tokens per shard against the shard size"),
    ("vs-parent", "parent.png", "documents added/removed per input against the parent, length distributions overlaid"),
)
_KEY_KINDS = ("progress", "shards", "summary", "manifest", "card", *(kind for kind, _, _ in CARD_IMAGES))
# The order a reader meets a run's artifacts in: the summary first, the progress bar (made first) last.
ARTIFACT_ORDER = ("summary", "shards", "manifest", "card", *(kind for kind, _, _ in CARD_IMAGES), "progress")


def creation_order(kinds: list[str]) -> list[str]:
    """``kinds`` in the order to create them, so that newest first is :data:`ARTIFACT_ORDER` (the progress bar aside)."""
    unknown = sorted(set(kinds) - set(ARTIFACT_ORDER))
    if unknown:
        raise ValueError(f"unknown artifact kinds {unknown}")
    return sorted(kinds, key=ARTIFACT_ORDER.index, reverse=True)


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
    """One row per shard, in manifest order: the table artifact's content."""
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


def card_plots(directory: str | Path, ref: str) -> list[tuple[str, str, str]]:
    """``(artifact kind, markdown, description)`` of each plot the version's card has (none without one).

    The markdown is the PNG alone (a ``data:`` URL), which the UI draws; the description says what it is.
    """
    card = Path(directory) / "card"
    out = []
    for kind, png, what in CARD_IMAGES:
        path = card / png
        if path.is_file():
            text = f"![{what}]({_data_url(path)})\n"
            out.append((kind, text, f"{ref}: {what} (card/{png})"))
    return out


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


def manifest_markdown(manifest_path: str | Path, ref: str, catalog: str | Path) -> str:
    """Where the version's manifest is, and the commands that read it: text a reader can copy."""
    import shlex

    path = Path(manifest_path).resolve()
    cat = f" --catalog {shlex.quote(str(Path(catalog).resolve()))}"
    return "\n".join([
        f"# Manifest of {ref}",
        "",
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
    ])


def _cell(text: Any) -> str:
    """Text for a markdown table cell: a '|' would end the cell, so it is escaped."""
    return str(text).replace("|", "\\|")


def _n(x: Any) -> str:
    return f"{x:,}" if isinstance(x, int) else str(x)


def _rate(tokens: int, seconds: float | None) -> str:
    if not seconds or seconds <= 0:
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
) -> str:
    """The run's markdown summary."""
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
        "| | |",
        "|---|---|",
        f"| Published reference | `{manifest.ref}` |",
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
        lines += [
            "| step | time | rate |",
            "|---|---:|---:|",
        ]
        if tokenize_seconds is not None:
            new_tokens = t["tokens"] if tokenized_tokens is None else tokenized_tokens
            unit_part = f" ({_n(units)} work units)" if units is not None else ""
            lines.append(f"| tokenize{unit_part} | {tokenize_seconds:.1f} s | {_rate(new_tokens, tokenize_seconds)} |")
        if seconds is not None:
            mb = f", {input_bytes / seconds / 1e6:,.1f} MB/s of input" if input_bytes and seconds > 0 else ""
            lines.append(f"| whole build | {seconds:.1f} s | {_rate(t['tokens'], seconds)}{mb} |")
        lines += ["", f"Task runner: `{runner}`."]
        if tokenized_tokens is not None and tokenized_tokens != t["tokens"]:
            lines += [
                "",
                f"Incremental: {_n(tokenized_tokens)} tokens were tokenized in this run; the other "
                f"{_n(t['tokens'] - tokenized_tokens)} came unchanged from `{manifest.parent}`.",
            ]
    else:
        lines.append("Nothing was tokenized: this run found the identical version already published.")
    return "\n".join(lines) + "\n"


def _boundary_cell(section: dict) -> str:
    """``<|endoftext|>`` = 100257 (bos), or each placed token: BOS `<|x|>` = 1, EOS `<|y|>` = 2 (both)."""
    return boundary_tokens(section).describe(lambda text: f"`{_cell(text)}`")
