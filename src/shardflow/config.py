"""The build configuration: one frozen, validated object that also goes into the manifest."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from .errors import ConfigError
from .formats import FORMATS
from .formats.base import MAX_SHARD_TOKENS

__all__ = ["BuildConfig", "EmbedOptions", "EMBED_CODECS", "BACKENDS", "NAME_RE", "check_name"]

# Tokenizer backends; defined here (not in tokenizers.py) so that importing the
# config does not import pyarrow and tiktoken: the training runtime needs neither.
BACKENDS = ("auto", "gigatoken", "tiktoken")

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")

# Fields that change nothing in the output bytes: how the work is cut up and
# which (identical) backend runs it. They stay out of the build key, so a
# rebuild that only changes them reports the existing version.
_NOT_IN_BUILD_KEY = frozenset({"sources", "backend", "unit_bytes", "batch_bytes", "batch_rows", "description"})


def check_name(name: str) -> str:
    """A dataset name: lowercase letters, digits, '.', '_' and '-', at most 64 characters."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ConfigError(
            f"dataset name {name!r} is not allowed; use 1-64 lowercase letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


EMBED_CODECS = ("float32", "float16", "e4m3", "e5m2", "e4m3-rowscale", "e5m2-rowscale", "int8")


@dataclass(frozen=True, kw_only=True)
class EmbedOptions:
    """How the embedding stage embeds and stores one vector per document."""

    codec: str = "int8"
    model: str = "all-MiniLM-L6-v2"
    long_docs: Literal["truncate", "chunk"] = "truncate"
    precision: Literal["bf16", "fp32"] = "bf16"
    max_tokens: int = 256
    batch_size: int = 32
    device: str = "auto"
    docs_per_batch: int = 256
    """Documents decoded and embedded at once: the stage's memory bound."""
    quality_sample: int = 2000
    min_mean_cosine: float = 0.99
    """Floor of the codec's mean cosine to the float32 rows it stores (after the PCA, if any)."""
    min_recall_at_10: float = 0.90
    embed_dim: int | None = None
    """Keep this many principal components (a PCA fitted on the version's own embeddings) before
    the codec; None: store the model's full dimension."""
    pca_sample: int = 10_000
    """Rows of the train split (evenly spaced) the PCA is fitted on: bounds the fit's memory,
    about 3 x rows x model dim x 8 bytes (the fit of 10,000 x 768 raised the peak RSS by 207 MB here)."""
    pca_min_mean_cosine: float = 0.90
    """Floor of the mean cosine of the reconstructed rows (PCA and codec) to the float32 originals."""
    pca_min_recall_at_10: float = 0.70
    """Floor of recall@10 of neighbours found in the reduced space against the float32 originals'."""

    def __post_init__(self) -> None:
        if self.codec not in EMBED_CODECS:
            raise ConfigError(f"unknown embedding codec {self.codec!r}; use one of {', '.join(EMBED_CODECS)}")
        if self.long_docs not in ("truncate", "chunk"):
            raise ConfigError(f"long_docs must be 'truncate' or 'chunk', not {self.long_docs!r}")
        if self.precision not in ("bf16", "fp32"):
            raise ConfigError(f"precision must be 'bf16' or 'fp32', not {self.precision!r}")
        if self.docs_per_batch < 1 or self.quality_sample < 0:
            raise ConfigError("docs_per_batch must be positive and quality_sample non-negative")
        floors = (self.min_mean_cosine, self.min_recall_at_10, self.pca_min_mean_cosine, self.pca_min_recall_at_10)
        if not all(0.0 <= f <= 1.0 for f in floors):
            raise ConfigError(
                "quality floors (min_mean_cosine, min_recall_at_10, pca_min_mean_cosine, pca_min_recall_at_10) "
                "must be in [0, 1]"
            )
        if self.embed_dim is not None:
            self._check_embed_dim(self.embed_dim)

    def _check_embed_dim(self, k: int) -> None:
        from .embedder import MODELS  # numpy only; torch stays unimported
        from .pca import check_reduction

        if isinstance(self.pca_sample, bool) or not isinstance(self.pca_sample, int) or self.pca_sample < 2:
            raise ConfigError(f"pca_sample must be an integer of at least 2, not {self.pca_sample!r}")
        # An unknown model is refused by the embedder, by name; then only the sample is checked here.
        spec = MODELS.get(self.model)
        check_reduction(
            k,
            input_dim=spec.dim if spec is not None else k,
            sample_rows=self.pca_sample,
            where=f"embed_dim={k!r}" + (f" ({self.model} has {spec.dim} dimensions)" if spec else ""),
            more_rows="raise pca_sample",
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def key_fields(self) -> dict[str, Any]:
        """Options that change the stored embeddings (not where or how fast they are computed).

        Without a PCA its options change nothing and are left out, so the keys of
        versions embedded before the PCA existed stay the same.
        """
        skip = {"device", "batch_size", "docs_per_batch"}
        if self.embed_dim is None:
            skip |= {"embed_dim", "pca_sample", "pca_min_mean_cosine", "pca_min_recall_at_10"}
        return {k: v for k, v in self.to_dict().items() if k not in skip}


@dataclass(frozen=True, kw_only=True)
class BuildConfig:
    """Everything that determines a build's output. Same config and inputs, same bytes."""

    name: str
    sources: tuple[str, ...]
    text_column: str = "text"
    id_column: str | None = None
    tokenizer: str = "cl100k_base"
    backend: str = "auto"
    format: str = "nanogpt"
    shard_tokens: int = 100_000_000
    boundary: Literal["bos", "eos"] = "bos"
    val_fraction: float = 0.0
    val_count: int = 0
    seed: int = 0
    utf8_errors: Literal["replace", "skip"] = "replace"
    description: str = ""
    unit_bytes: int = 64 << 20
    """Target size of one work unit, in uncompressed text bytes (row groups are never split)."""
    batch_bytes: int = 32 << 20
    """Text bytes read and tokenized at once (estimated from each unit's bytes per row);
    memory is bounded by this x workers, not by the corpus size. Bigger batches let the
    fast tokenizer spread one call over every core."""
    batch_rows: int = 65536
    """Upper bound on the rows of one batch, whatever their size."""
    """Rows read and tokenized at once; memory is bounded by this, not by the corpus size."""
    embed: EmbedOptions | None = None
    """Compute one embedding per document (``--embed``); None: no embedding stage."""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_name(self.name)
        if isinstance(self.embed, dict):
            object.__setattr__(self, "embed", EmbedOptions(**self.embed))
        if isinstance(self.sources, str):
            object.__setattr__(self, "sources", (self.sources,))
        object.__setattr__(self, "sources", tuple(str(s) for s in self.sources))
        if not self.sources:
            raise ConfigError("no sources given; pass at least one Parquet/Arrow file, directory or glob")
        if not self.text_column:
            raise ConfigError("text_column must be a non-empty column name")
        if self.backend not in BACKENDS:
            raise ConfigError(f"unknown tokenizer backend {self.backend!r}; use one of {', '.join(BACKENDS)}")
        if self.format not in FORMATS:
            raise ConfigError(f"unknown shard format {self.format!r}; use one of {', '.join(FORMATS)}")
        if isinstance(self.shard_tokens, bool) or not isinstance(self.shard_tokens, int):
            raise ConfigError(f"shard_tokens must be an integer, not {self.shard_tokens!r}")
        if not 1 <= self.shard_tokens <= MAX_SHARD_TOKENS:
            raise ConfigError(
                f"shard_tokens={self.shard_tokens} is out of range; a shard holds 1 to {MAX_SHARD_TOKENS} tokens "
                "(2**31 - 1, because .bos.idx entries are int32)"
            )
        if self.boundary not in ("bos", "eos"):
            raise ConfigError(f"boundary must be 'bos' or 'eos', not {self.boundary!r}")
        if not (isinstance(self.val_fraction, (int, float)) and math.isfinite(self.val_fraction)):
            raise ConfigError(f"val_fraction must be a number in [0, 1), not {self.val_fraction!r}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ConfigError(f"val_fraction={self.val_fraction} must be in [0, 1)")
        if isinstance(self.val_count, bool) or not isinstance(self.val_count, int) or self.val_count < 0:
            raise ConfigError(f"val_count must be a non-negative integer, not {self.val_count!r}")
        if self.val_fraction and self.val_count:
            raise ConfigError("give val_fraction or val_count, not both")
        if self.utf8_errors not in ("replace", "skip"):
            raise ConfigError(f"utf8_errors must be 'replace' or 'skip', not {self.utf8_errors!r}")
        if self.unit_bytes < 1 or self.batch_rows < 1 or self.batch_bytes < 1:
            raise ConfigError("unit_bytes, batch_bytes and batch_rows must be positive")

    @property
    def has_val(self) -> bool:
        return bool(self.val_fraction or self.val_count)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["sources"] = list(self.sources)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BuildConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown build options: {', '.join(unknown)}")
        d = dict(d)
        d["sources"] = tuple(d.get("sources", ()))
        return cls(**d)

    def key_fields(self) -> dict[str, Any]:
        """The options that determine the output bytes (see ``_NOT_IN_BUILD_KEY``)."""
        fields = {k: v for k, v in self.to_dict().items() if k not in _NOT_IN_BUILD_KEY}
        fields["embed"] = None if self.embed is None else self.embed.key_fields()
        return fields

    def replace(self, **changes: Any) -> "BuildConfig":
        return dataclasses.replace(self, **changes)
