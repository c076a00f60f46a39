"""The build key (what determines a version's bytes), and which version a plan's build is, once it is published.

A plan that left local files unhashed (``pipeline/plan.py``) is keyed by their
stat; the version it publishes is keyed by their content (``staged.content_key``).
``published_build`` finds that version for a run that waited for another run
of the same build: that run's workers recorded the hashes in the fingerprint
cache, so the content key is known without reading a file.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..catalog import Catalog, VersionEntry
from ..config import BuildConfig
from ..sources import InputFile
from ..sources.fingerprint import cached_hashes
from ..tokenizers import Tokenizer, load_tokenizer
from .model import BUILD_FORMAT_VERSION, BuildPlan

__all__ = ["build_key", "published_build"]


def build_key(config: BuildConfig, inputs: list[InputFile], tokenizer: Tokenizer) -> str:
    """SHA-256 of everything that determines the output bytes: same key, same version."""
    payload = {
        "build_format_version": BUILD_FORMAT_VERSION,
        "config": config.key_fields(),
        # The SHA-256, or for an object on object storage its identity there (ETag, version id), or for a local
        # file planned unhashed its stat (a plan's key only: a version's key is its content's).
        "inputs": [[i.relname, i.size, i.key_identity] for i in inputs],
        "tokenizer": tokenizer.key_facts(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def published_build(plan: BuildPlan) -> VersionEntry | None:
    """The version the catalog lists for ``plan``'s build: by its key, or, where the plan left local files unhashed,
    by the key of their content as the fingerprint cache knows it now (None: not published, or not known)."""
    cat = Catalog(plan.catalog)
    found = cat.find_build(plan.config.name, plan.build_key)
    if found is not None or all(inp.sha256 or inp.identity for inp in plan.inputs):
        return found
    known = cached_hashes(plan.inputs, Path(plan.data_root) / plan.config.name)
    if not all(inp.sha256 or inp.identity for inp in known):
        return None
    tokenizer = load_tokenizer(plan.config.tokenizer, backend=plan.config.backend)
    return cat.find_build(plan.config.name, build_key(plan.config, known, tokenizer))
