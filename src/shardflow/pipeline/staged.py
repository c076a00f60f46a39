"""What a staged build holds so far, read from the stages' records: its build key and its manifest.

Read by the stages that need the manifest before it is published (embed, validate, publish); reads only.
"""

from __future__ import annotations

import json
import os

from ..errors import ValidationError
from ..manifest import Manifest
from ..tokenizers import load_tokenizer
from .assemble import TokenizerInfo, assemble_manifest, hashed_inputs, now
from .layout import read_layout, unit_results
from .model import BuildPlan, EmbedResult, UnitResult
from .keys import build_key
from .staging import Staging, as_plan
from .target_files import tokenizer_file_name
from .write import read_shard_results

__all__ = ["staged_manifest", "content_key", "read_embed_result"]


def read_embed_result(plan: BuildPlan) -> EmbedResult | None:
    """The embedding stage's recorded sections (None without ``config.embed``); raises if it has not run."""
    if plan.config.embed is None:
        return None
    path = Staging(plan.staging).embed_file
    if not path.exists():
        raise ValidationError(f"{plan.staging}: the embedding stage has not run; run embed_staged first")
    return EmbedResult.from_dict(json.loads(path.read_text()))


def content_key(plan: BuildPlan | str | os.PathLike[str], units: list[UnitResult] | None = None) -> str:
    """The build key of what was read: the plan's, with every object's SHA-256 for its storage identity.

    Planning keys an object on object storage that no earlier version recorded
    by its identity there (ETag, version id), and a local file that no version
    holds by its stat, not having read them; the workers hashed them since. The manifest and the catalog record this key, which is the
    one a build of a local copy of the same files has.
    """
    plan = as_plan(plan)
    if all(inp.sha256 for inp in plan.inputs):
        return plan.build_key
    filled = hashed_inputs(plan, unit_results(plan) if units is None else units)
    unhashed = [inp.path for inp in filled if not inp.sha256 and not inp.identity]
    if unhashed:  # a local file planned by its stat, which the job of its first unit hashes: never keyed by a stat
        raise ValidationError(f"{unhashed[0]}: no SHA-256 was recorded by the job of its first work unit; "
                              "tokenize that unit again (delete its parts/unit-N.json) or build again")
    return build_key(plan.config, filled, load_tokenizer(plan.config.tokenizer, backend=plan.config.backend))


def staged_manifest(plan: BuildPlan | str | os.PathLike[str], *, embeddings: bool = True) -> Manifest:
    """The manifest of a staged build (version not yet assigned), from the stages' recorded results; reads only."""
    plan = as_plan(plan)
    cfg = plan.config
    tokenizer = load_tokenizer(cfg.tokenizer, backend=cfg.backend)
    units = unit_results(plan)
    return assemble_manifest(
        plan,
        layout=read_layout(plan),
        units=units,
        build_key=content_key(plan, units),
        shards=read_shard_results(plan),
        tokenizer=TokenizerInfo.of(tokenizer, rank_file=tokenizer_file_name(tokenizer)),
        embeddings=read_embed_result(plan) if embeddings else None,
        created_at=now(),
    )
