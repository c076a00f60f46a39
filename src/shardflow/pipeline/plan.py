"""Planning a build: find and fingerprint the inputs, cut work units, compute the build key, prepare staging.

The plan is the only stage that looks at the catalog to decide what to do:
whether an identical version exists (``existing``), which version this build
succeeds (``parent``) and which of its inputs that version already holds
(``reuse``). Everything later reads the plan and never decides again.

Each input byte is read once. Planning reads no input that tokenizing reads
anyway, as it reads no object on object storage: an input's SHA-256 comes from
the stat-keyed fingerprint cache (``sources/fingerprint.py``); failing that, a
local file is hashed here only if the latest version holds a file of its name
and size (``_held``). Any other file is planned by its stat (``InputFile.stat``
stands in for the hash in the plan's key, ``key_identity``), and the job of its
first unit hashes it from the bytes it reads (``sources/hashing.py``), records
the hash in the unit's result and in the fingerprint cache. Why that is correct:

- The published version's key is the content key: ``staged.content_key`` puts
  the workers' hashes in (``assemble.hashed_inputs``), so the manifest and the
  catalog record the key planning would have computed by hashing, and a later
  build of the same bytes finds the version. A local input never keys a
  version by its stat (``content_key`` refuses one left unhashed).
- "Published already?": a version's key and incremental reuse both match an
  input by name, size and SHA-256, so a file whose name and size no input of
  the latest version has can be neither reused nor part of the latest
  version's key: waiting for its hash decides nothing differently. A file whose
  name and size it has is hashed here, as before. An older version is checked
  at publish instead (``publish_out`` answers its key with that version and
  publishes nothing): a build that puts back an earlier version's inputs with
  new mtimes tokenizes them before it finds that version.
- The staging directory: a plan keyed by a stat is named by that key. A rerun
  after a crash may know more (its workers recorded hashes), so its key could
  differ; a staging directory whose plan has this build's options and the same
  files by path, size and stat is this build's (``_interrupted``), and the
  rerun resumes it under its key. A run that waited for another run of the
  same build finds the version that run published by the content key the
  cache now knows (``keys.published_build``); a staging directory whose publish
  died past its catalog entry is removed as published (its ``publish.json``
  names the content key).
- An input changed during the build: every unit's job checks the file's size
  and mtime against the plan's stat before and after reading it
  (``tokenize.check_unchanged``), so the hash its first unit takes is of the
  planned bytes, as planning's hash was.

The exceptions (``sources/hashing.py``): planning reads each Parquet footer
(64 KiB) to cut the units; a JSON Lines file is read in full by planning to
count its lines, and hashed in that same pass (read twice, not three times);
a file cut into several units is hashed by its first unit's job, which reads
the rest of the file after its own unit (bytes the other units read too).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..catalog import Catalog, default_catalog, default_data_root
from ..config import BuildConfig
from ..errors import CatalogError, ConfigError, InputError
from ..faults import fault
from ..formats import get_format
from ..formats.base import TOKEN_DTYPES
from ..sources import InputFile, WorkUnit, discover_inputs, fingerprint_inputs, plan_units
from ..sources.fingerprint import local_stat, record_fingerprints
from ..tokenizers import Tokenizer, load_tokenizer
from ..targets import get_target
from .incremental import NO_REUSE_ENV, ManifestCache, plan_reuse, recorded_hashes
from .keys import build_key, published_build
from .model import BUILD_FORMAT_VERSION, Boundaries, BuildPlan, Reuse
from ..sources.cuts import cut_in_bytes
from .staging import (
    Staging,
    adopt_orphan,
    discard_staging,
    read_old_plan,
    remove_abandoned,
    reset_staging,
    staging_lock,
    staging_name,
    sweep_stale_tmp,
    write_plan,
)

__all__ = ["plan_build", "token_dtype", "build_key", "resolve_boundaries"]

_FLAGS = {"bos": "--bos-token", "eos": "--eos-token"}


def token_dtype(tokenizer: Tokenizer) -> np.dtype:
    """uint16 if every id the encoding can emit fits (max id < 2**16), else uint32."""
    # uint16 is enough for GPT-2's 50257 ids; cl100k's specials reach 100276, so it needs uint32.
    return TOKEN_DTYPES["uint16"] if tokenizer.max_token_value < 2**16 else TOKEN_DTYPES["uint32"]


def _resolve_token(tokenizer: Tokenizer, kind: str, given: str | None, dtype: np.dtype) -> tuple[str, int]:
    """``(text, id)`` of the BOS or EOS (``kind``): the one given (text or all-digit id), else the tokenizer's own."""
    flag = _FLAGS[kind]
    what = kind.upper()
    if given is None:
        try:
            found = tokenizer.default_bos if kind == "bos" else tokenizer.default_eos
        except Exception as exc:  # a family that cannot tell says why
            raise ConfigError(
                f"tokenizer {tokenizer.name!r}: its default {what} token cannot be found ({exc}); "
                f"give one with {flag} TEXT or {flag} ID"
            ) from None
        if found is None:
            raise ConfigError(
                f"tokenizer {tokenizer.name!r} defines no {what} token; give one with {flag} TEXT or {flag} ID"
            )
        text, token_id = str(found[0]), int(found[1])
    elif given.isdigit():
        token_id = int(given)
        if token_id >= tokenizer.vocab_size:
            raise ConfigError(
                f"{flag} {given}: id {token_id} is not in the vocabulary of {tokenizer.name!r}, whose ids are "
                f"0 to {tokenizer.vocab_size - 1}"
            )
        text_or_none = tokenizer.token_text(token_id)
        if text_or_none is None:
            raise ConfigError(f"{flag} {given}: id {token_id} is not a token of {tokenizer.name!r} (an unused id)")
        text = text_or_none
    else:
        id_or_none = tokenizer.token_id(given)
        if id_or_none is None:
            raise ConfigError(
                f"{flag} {given!r}: no token of {tokenizer.name!r} has this text; give a special token's or a "
                "single token's exact text, or its id"
            )
        text, token_id = given, int(id_or_none)
    if given is not None and tokenizer.encode_ordinary(text) == [token_id]:
        # Text in a document encodes to it, so the shards' boundaries could not be told apart from it
        # (validation would refuse the shards after every input was tokenized).
        raise ConfigError(
            f"{flag} {given}: {text!r} (id {token_id}) is an ordinary token of {tokenizer.name!r}, which documents "
            f"contain wherever their text has it; give a special token (one that no text encodes to) by text or id"
        )
    if not 0 <= token_id < tokenizer.vocab_size or token_id > np.iinfo(dtype).max:
        raise ConfigError(
            f"{flag}: the {what} token {text!r} (id {token_id}) does not fit the vocabulary of {tokenizer.name!r} "
            f"({tokenizer.vocab_size} ids) and its {dtype.name} shards"
        )
    return text, token_id


def resolve_boundaries(config: BuildConfig, tokenizer: Tokenizer, dtype: np.dtype | None = None) -> Boundaries:
    """The build's boundary tokens: ``config.bos_token``/``eos_token`` or the tokenizer's defaults.

    Raises ``ConfigError`` naming the flag to give (``--bos-token``/``--eos-token``)
    when a default cannot be found, and naming a token that is not in the vocabulary.
    """
    dtype = token_dtype(tokenizer) if dtype is None else np.dtype(dtype)
    placement = config.boundary
    bos = _resolve_token(tokenizer, "bos", config.bos_token, dtype) if placement in ("bos", "both") else None
    eos = _resolve_token(tokenizer, "eos", config.eos_token, dtype) if placement in ("eos", "both") else None
    return Boundaries(placement=placement, bos=bos, eos=eos)


def plan_build(
    config: BuildConfig,
    *,
    data_root: str | os.PathLike[str] | None = None,
    catalog: str | os.PathLike[str] | None = None,
    reuse: bool | None = None,
    lock_timeout: float | None = 0,
) -> BuildPlan:
    """Find and fingerprint the inputs, cut work units, and prepare (or resume) the staging directory.

    Incremental: inputs unchanged since the parent version (the catalog's
    latest, if built with the same options) get no work units; their tokens are
    taken from the parent's shards (``reuse=False``, or ``SHARDFLOW_NO_REUSE=1``,
    rebuilds everything). The output is the same either way.

    Resuming: a staging directory left by an interrupted run of the same build
    is kept (its finished units, shards and files are reused), unless the plan
    changed, and then it is emptied. It holds the build's lock while it does
    so: if another run of the same build holds it, it fails at once with a
    message saying so (``lock_timeout``: waits that many seconds, ``None``: no
    limit, and reports the version the other run published).
    """
    root = default_data_root(data_root)
    cat = Catalog(default_catalog(catalog))
    fmt = get_format(config.format)
    tokenizer = load_tokenizer(config.tokenizer, backend=config.backend)
    dtype = token_dtype(tokenizer)
    # Resolved once, before any input is read: a bad token fails here, with nothing staged.
    boundaries = resolve_boundaries(config, tokenizer, dtype)
    if config.target is not None:  # what the trainer's reader cannot read is refused (by its name) before anything is staged
        get_target(config.target).check_tokens(
            dtype=dtype.name,
            vocab_size=tokenizer.vocab_size,
            bos_id=boundaries.bos_id,
            eos_id=boundaries.eos_id,
            tokenizer=config.tokenizer,
        )
    fmt.check_dtype(dtype)
    dataset_dir = root / config.name
    manifests = ManifestCache(cat, config.name)
    inputs = fingerprint_inputs(discover_inputs(config.sources), cache_dir=dataset_dir, hash_now=_held(manifests))
    inputs = recorded_hashes(inputs, manifests)  # objects on object storage read by the latest version
    digests: dict[int, str] = {}  # local files read in full to be cut (JSON Lines), hashed in that pass
    units = plan_units(inputs, text_column=config.text_column, id_column=config.id_column, unit_bytes=config.unit_bytes,
                       digests=digests)
    if not units or all(u.rows == 0 for u in units):  # (-1: not counted while planning, see sources/jsonl.py)
        raise InputError(f"the corpus is empty: {', '.join(config.sources)} hold no rows")
    inputs = _hashed_while_planned(inputs, units, digests, dataset_dir)
    key = build_key(config, inputs, tokenizer)
    # An interrupted run of this build that left inputs to its workers to hash, which this run may know by now.
    resumed = _interrupted(dataset_dir, cat, config, inputs, tokenizer, key)
    if resumed is not None and cat.find_build(config.name, key) is None:
        inputs, key = resumed
    # One per build and catalog: catalogs that share the data root never resume (nor publish) each other's builds.
    staging = Staging(dataset_dir / ".staging" / staging_name(key, cat))
    # Other builds' staging directories that no rerun will resume (published, or staged by an older shardflow).
    remove_abandoned(dataset_dir, cat, config.name, keep=staging.root)
    latest = cat.latest(config.name)
    plan = BuildPlan(
        config=config,
        staging=str(staging.root),
        data_root=str(root),
        catalog=str(cat.path),
        build_key=key,
        inputs=tuple(inputs),
        units=tuple(units),
        dtype=str(dtype.name),
        boundaries=boundaries,
        parent=f"{config.name}@{latest}" if latest else None,
    )
    existing = cat.find_build(config.name, key)
    if existing is not None:
        # A publish killed after its catalog entry leaves its staging directory behind (one named by a key of
        # unhashed files is removed above: its publish.json names the published key).
        if staging.root.exists():
            try:
                with staging_lock(staging, config.name, 0):
                    discard_staging(staging.root)
            except CatalogError:
                pass  # the run that published it is still cleaning up
        return dataclasses.replace(plan, existing=f"{config.name}@{existing.version}")
    if reuse is None:
        reuse = os.environ.get(NO_REUSE_ENV, "").strip() in ("", "0")
    if reuse:
        # An interrupted run of this build chose its parent: keep it, so that its work stays valid.
        old = read_old_plan(staging, key)
        chosen = plan_reuse(
            config, inputs, tokenizer, dtype, cat, ((old or {}).get("reuse") or {}).get("parent"), boundaries=boundaries,
            manifests=manifests,
        )
        if chosen is not None:
            chosen = dataclasses.replace(chosen, split_late=bool(cut_in_bytes(inputs, units) & set(chosen.inputs)))
            kept = [u for u in units if u.input not in chosen.inputs]
            units = [dataclasses.replace(u, index=n) for n, u in enumerate(kept)]
            # The version whose tokens this build takes is the one it succeeds.
            plan = dataclasses.replace(plan, units=tuple(units), reuse=chosen, parent=chosen.parent)
    staging.root.mkdir(parents=True, exist_ok=True)
    with staging_lock(staging, config.name, lock_timeout):
        found = published_build(plan)
        if found is not None:  # published by another run while this one waited for the lock
            discard_staging(staging.root)
            return dataclasses.replace(plan, existing=f"{config.name}@{found.version}", reuse=None)
        plan = _prepare_staging(plan, cat)
    fault("plan")
    return plan


def _held(manifests: ManifestCache) -> Callable[[InputFile], bool]:
    """Which local files that the fingerprint cache does not know planning hashes: those of the name and size of an
    input of the latest version, whose bytes may decide what to reuse, or that the build is published already.
    Another file holds bytes that no version read (a version's build key, and incremental reuse, match an input by
    name, size and SHA-256), so its hash can wait for the worker that reads it."""
    held: set[tuple[Any, Any]] | None = None

    def hash_now(inp: InputFile) -> bool:
        nonlocal held
        if held is None:
            held = {(e.get("relname"), e.get("size")) for e in manifests.latest_inputs()}
        return (inp.relname, inp.size) in held

    return hash_now


def _hashed_while_planned(
    inputs: list[InputFile], units: list[WorkUnit], digests: dict[int, str], cache_dir: Path
) -> list[InputFile]:
    """``inputs`` with the SHA-256 of the local files that planning read in full anyway (``digests``: a JSON Lines
    file, whose lines it counts), recorded in the fingerprint cache, and of those that no work unit reads (no
    worker would hash them: a file without rows)."""
    out = list(inputs)
    recorded = {}
    for i, sha in digests.items():
        if local_stat(out[i].path) == out[i].stat:  # (else changed since: its workers refuse it)
            out[i] = dataclasses.replace(out[i], sha256=sha)
            recorded[out[i].path] = (out[i].stat, sha)
    if recorded:
        cache_dir.mkdir(parents=True, exist_ok=True)
        record_fingerprints(cache_dir, recorded)
    read = {u.input for u in units}
    unread = [i for i, inp in enumerate(out) if not inp.sha256 and not inp.identity and i not in read]
    for i, inp in zip(unread, fingerprint_inputs([out[i] for i in unread], cache_dir=cache_dir)):
        out[i] = inp
    return out


def _interrupted(
    dataset_dir: Path, cat: Catalog, config: BuildConfig, inputs: list[InputFile], tokenizer: Tokenizer, key: str
) -> tuple[list[InputFile], str] | None:
    """The inputs and key of an interrupted run of this build that planned some input unhashed, if any.

    Its workers may have hashed those inputs since (and recorded them in the
    fingerprint cache), so this run may know more than that one did, and key
    the same build otherwise. A plan with this build's options and the same
    files (by path, size and stat, and SHA-256 where both know it) is this
    build's: its inputs, as that run knew them, keep their key and so its
    staging directory, and the run resumes it.
    """
    here = dataset_dir / ".staging" / staging_name(key, cat)
    parent = dataset_dir / ".staging"
    if Staging(here).plan_file.exists() or not parent.is_dir():
        return None
    for path in sorted(parent.iterdir()):
        if path == here or not re.fullmatch(r"[0-9a-f]{16}", path.name):
            continue
        try:
            old = json.loads(Staging(path).plan_file.read_text())
            theirs = [InputFile(**e) for e in old["inputs"]]
        except (OSError, ValueError, TypeError, KeyError):
            continue
        if len(theirs) != len(inputs) or all(t.sha256 for t in theirs) or not all(
            (t.path, t.relname, t.kind, t.size, t.identity, t.stat) == (i.path, i.relname, i.kind, i.size, i.identity, i.stat)
            and not (t.sha256 and i.sha256 and t.sha256 != i.sha256)
            for t, i in zip(theirs, inputs)
        ):
            continue
        old_key = build_key(config, theirs, tokenizer)
        if old.get("build_format_version") == BUILD_FORMAT_VERSION and old.get("build_key") == old_key and (
            path.name == staging_name(old_key, cat)
        ):
            return theirs, old_key
    return None


def _same_work(old: dict, plan: BuildPlan) -> bool:
    """Whether an earlier run's plan cut the same units from the same parent (its staged work is ours)."""
    old_reuse = Reuse.from_dict(old.get("reuse"))
    return old.get("units") == [u.to_dict() for u in plan.units] and (
        (old_reuse.signature() if old_reuse else None) == (plan.reuse.signature() if plan.reuse else None)
    )


def _prepare_staging(plan: BuildPlan, cat: Catalog) -> BuildPlan:
    """Resume the staging directory of an interrupted run of this plan, or start it afresh (lock held)."""
    staging = Staging(plan.staging)
    dataset_dir = staging.root.parent.parent
    old = read_old_plan(staging, plan.build_key)
    if old is not None and _same_work(old, plan):
        # Resume: everything a previous run committed here is reused, the parent it chose included.
        resumed = BuildPlan.from_dict(old)
        # Today's inputs (the same bytes: the build key says so), with the stats the workers check them against.
        plan = dataclasses.replace(resumed, existing=None, boundaries=resumed.boundaries or plan.boundaries,
                                   inputs=plan.inputs)
        if resumed.boundaries is None or resumed.inputs != plan.inputs:
            write_plan(plan)
        adopt_orphan(cat, plan, dataset_dir)
        sweep_stale_tmp(staging)
    else:
        # A new plan (or one that changed: other work units or another parent).
        reset_staging(staging)
        write_plan(plan)
        adopt_orphan(cat, plan, dataset_dir)
    staging.parts.mkdir(exist_ok=True)
    return plan
