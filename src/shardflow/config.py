"""The build configuration: one frozen, validated object that also goes into the manifest."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from .embed.models import MODELS
from .errors import ConfigError
from .formats import FORMATS
from .formats.base import MAX_SHARD_TOKENS
from .embed.pca import check_reduction
from .targets import get_target

__all__ = ["BuildConfig", "EmbedOptions", "EMBED_CODECS", "BACKENDS", "BOUNDARY_PLACEMENTS", "TARGET_DEFAULTS", "NAME_RE", "check_name", "recorded_options"]

# Tokenizer backends; defined here (not in tokenizers.py) so that importing the
# config does not import pyarrow and tiktoken: the training runtime needs neither.
# After auto and gigatoken, each family's reference backend, named after its library.
BACKENDS = ("auto", "gigatoken", "tiktoken", "hf", "sentencepiece")

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")

# Fields that change nothing in the output bytes: how the work is read in batches
# and which (identical) backend runs it. They stay out of the build key, so a
# rebuild that only changes them reports the existing version. ``unit_bytes`` is
# in it: a unit's boundaries are its input's and the unit size's (sources/cuts.py).
_NOT_IN_BUILD_KEY = frozenset({"sources", "backend", "batch_bytes", "batch_rows", "description"})

# Where the boundary tokens go: before each document, after it, or both (BOS + ids + EOS).
BOUNDARY_PLACEMENTS = ("bos", "eos", "both")

# The options a trainer target decides, and their values without a target. Their fields default
# to None ("not given"), so that an explicit value, even one equal to these, is told from an unset
# one and checked against the target; ``__post_init__`` resolves them, so a made config (its
# ``to_dict``, its build key) never holds None.
TARGET_DEFAULTS: Mapping[str, Any] = MappingProxyType({"format": "nanogpt", "boundary": "bos", "shard_tokens": 100_000_000})

# Options left out of ``to_dict`` (and so of the manifest and the build key) while unset.
_OMITTED_WHEN_NONE = ("bos_token", "eos_token", "target", "stats_column")
# Options added after versions were published, left out of ``to_dict`` at these defaults.
_OMITTED_AT_DEFAULT: dict[str, Any] = {"on_bad_record": "fail", "stats": True, "card": True}
# Key fields that change files beside the token shards, never the tokens: an incremental build may
# reuse a parent's tokens whatever they were (``reuse_fields``).
_NOT_IN_TOKENS = frozenset({"embed", "stats", "card"})


def recorded_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """A manifest's recorded ``config``, with the options ``to_dict`` leaves out at their defaults put back."""
    return {**_OMITTED_AT_DEFAULT, **config}


def check_name(name: str) -> str:
    """A dataset name: lowercase letters, digits, '.', '_' and '-', at most 64 characters."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ConfigError(
            f"dataset name {name!r} is not allowed; use 1-64 lowercase letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


EMBED_CODECS = ("float32", "float16", "e4m3", "e5m2", "e4m3-rowscale", "e5m2-rowscale", "int8")
_LONG_DOCS = ("truncate", "chunk")
_PRECISIONS = ("bf16", "fp32")
_MAX_BATCH = 4096


def _is_int_in(value: object, lo: int, hi: int) -> bool:
    # bool is an int subclass; True as a batch size is a mistake, not 1.
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


def _valid_device(device: str) -> bool:
    if device in ("auto", "cpu", "cuda", "mps"):
        return True
    head, _, idx = device.partition(":")
    return head == "cuda" and idx.isdigit()


@dataclass(frozen=True, kw_only=True)
class EmbedOptions:
    """How the embedding stage embeds and stores one vector per document; validated on construction.

    One object for the whole stage: ``shardflow.embed.embedder.Embedder`` takes it as
    its config (``EmbedConfig`` there is this class), so a bad model, batch
    size or device is refused with a ``ConfigError`` (a ValueError) when the
    ``BuildConfig`` is made, before any tokenizing.

    - ``model``: one of ``shardflow.embed.models.MODELS``.
    - ``batch_size``: inputs per forward pass, 1..4096; at the default 32, scaled to the device
      (``embedder.DEVICE_BATCH_SIZES``).
    - ``max_tokens``: tokens per input including the two special tokens,
      8..the model's window (256 for all-MiniLM-L6-v2).
    - ``long_docs``: ``"truncate"`` keeps the first ``max_tokens`` tokens;
      ``"chunk"`` embeds every window-sized piece and averages them.
    - ``precision``: ``"bf16"`` (autocast, cosine ~0.99998 to fp32: faster on
      a GPU or a CPU with native bf16, several times slower on an AVX2-only CPU:
      docs/PERFORMANCE.md) or ``"fp32"``.
    - ``device``: ``"auto"`` (CUDA, then MPS, then CPU), ``"cpu"``,
      ``"cuda"``, ``"cuda:N"`` or ``"mps"``.
    """

    # The field order is the order of ``to_dict()``, which goes into manifests: keep it.
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
    about 3 x rows x model dim x 8 bytes (the fit's measured peak: docs/PERFORMANCE.md)."""
    pca_min_mean_cosine: float = 0.90
    """Floor of the mean cosine of the reconstructed rows (PCA and codec) to the float32 originals."""
    pca_min_recall_at_10: float = 0.70
    """Floor of recall@10 of neighbours found in the reduced space against the float32 originals'."""

    def __post_init__(self) -> None:
        if self.codec not in EMBED_CODECS:
            raise ConfigError(f"unknown embedding codec {self.codec!r}; use one of {', '.join(EMBED_CODECS)}")
        if self.model not in MODELS:
            raise ConfigError(f"unknown embedding model {self.model!r}; supported: {', '.join(sorted(MODELS))}")
        window = MODELS[self.model].window
        if not _is_int_in(self.batch_size, 1, _MAX_BATCH):
            raise ConfigError(f"batch_size must be an integer in [1, {_MAX_BATCH}], got {self.batch_size!r}")
        if not _is_int_in(self.max_tokens, 8, window):
            raise ConfigError(
                f"max_tokens must be an integer in [8, {window}] ({self.model}'s window, "
                f"special tokens included), got {self.max_tokens!r}"
            )
        if self.long_docs not in _LONG_DOCS:
            raise ConfigError(f"long_docs must be one of {', '.join(_LONG_DOCS)}; got {self.long_docs!r}")
        if self.precision not in _PRECISIONS:
            raise ConfigError(f"precision must be one of {', '.join(_PRECISIONS)}; got {self.precision!r}")
        if not isinstance(self.device, str) or not _valid_device(self.device):
            raise ConfigError(f"device must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'; got {self.device!r}")
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
        if isinstance(self.pca_sample, bool) or not isinstance(self.pca_sample, int) or self.pca_sample < 2:
            raise ConfigError(f"pca_sample must be an integer of at least 2, not {self.pca_sample!r}")
        spec = MODELS[self.model]  # checked above
        check_reduction(
            k,
            input_dim=spec.dim,
            sample_rows=self.pca_sample,
            where=f"embed_dim={k!r} ({self.model} has {spec.dim} dimensions)",
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
    format: str | None = None
    """The shard format (``shardflow.formats.FORMATS``); None: the target's, or ``nanogpt``."""
    shard_tokens: int | None = None
    """Tokens per shard, at most the format's ``max_tokens``; None: the target's (one file per split), or 10^8."""
    boundary: Literal["bos", "eos", "both"] | None = None
    """Where boundary tokens go: before each document (``bos``), after it (``eos``) or both (BOS + ids + EOS);
    None: the target's, or ``bos``."""
    bos_token: str | None = None
    """The BOS token's text or id (an all-digit string); None: the tokenizer's own (``default_bos``)."""
    eos_token: str | None = None
    """The EOS token's text or id (an all-digit string); None: the tokenizer's own (``default_eos``)."""
    val_fraction: float = 0.0
    val_count: int = 0
    seed: int = 0
    utf8_errors: Literal["replace", "skip"] = "replace"
    on_bad_record: Literal["fail", "skip"] = "fail"
    """A record that cannot be read (a JSON line that is not JSON, or lacks the text field):
    "fail" names its file and line and stops; "skip" skips and counts it (``bad_records``).
    Left out of ``to_dict`` (so of manifests and build keys) at its default."""
    description: str = ""
    unit_bytes: int = 256 << 20
    """Target size of one work unit, in uncompressed text bytes (row groups are never split). A unit's
    tokens become its own shard(s), so this sets the typical shard size: 256 MiB of text is about
    6.7 x 10^7 tokens (four bytes a token), and an input's last unit, up to 1.25 times that, still fits
    one shard of the default 10^8. Every core stays busy on a small corpus anyway: a batch's encoding is
    spread over the cores (``batch_bytes``)."""
    batch_bytes: int = 32 << 20
    """Text bytes read and tokenized at once (estimated from each unit's bytes per row);
    memory is bounded by this x workers, not by the corpus size. Bigger batches let the
    fast tokenizer spread one call over every core."""
    batch_rows: int = 65536
    """Upper bound on the rows of one batch, whatever their size."""
    embed: EmbedOptions | None = None
    """Compute one embedding per document (``--embed``); None: no embedding stage."""
    target: str | None = None
    """A trainer target (``shardflow.targets.TARGETS``): sets the format, boundary, dtype rule and file layout
    that stack's reader needs; options left at their defaults take the target's, others must agree with it.
    None: no target (left out of ``to_dict``, so of manifests and build keys)."""
    stats_column: str | None = None
    """A column (such as ``source``) whose values the statistics count tokens and documents by
    (``--stats-column``); None: per input only. Left out of ``to_dict`` (so of build keys) while unset."""
    stats: bool = True
    """Collect the statistics: ``stats.json``, ``stats.vocab.npy`` and the manifest's ``stats`` section
    (``--no-stats``: none of them, and no card). Part of the build key, as they are of the version's bytes."""
    card: bool = True
    """Draw the dataset card (``card/``: its plots and README.md) from the statistics (``--no-card``:
    ``stats.json`` only). The card is a view of the statistics: without them it is False."""
    _unset: frozenset[str] = dataclasses.field(default=frozenset(), init=False, repr=False, compare=False)
    """Which of ``TARGET_DEFAULTS`` were not given (so ``replace`` resolves them again); never serialized."""

    def __post_init__(self) -> None:
        check_name(self.name)
        self._resolve_target_options()
        if isinstance(self.embed, dict):
            object.__setattr__(self, "embed", EmbedOptions(**self.embed))
        if isinstance(self.sources, str):
            object.__setattr__(self, "sources", (self.sources,))
        object.__setattr__(self, "sources", tuple(str(s) for s in self.sources))
        if not self.sources:
            raise ConfigError("no sources given; pass at least one Parquet/Arrow/JSON Lines file, directory or glob")
        if not self.text_column:
            raise ConfigError("text_column must be a non-empty column name")
        if self.backend not in BACKENDS:
            raise ConfigError(f"unknown tokenizer backend {self.backend!r}; use one of {', '.join(BACKENDS)}")
        if self.format not in FORMATS:
            raise ConfigError(f"unknown shard format {self.format!r}; use one of {', '.join(FORMATS)}")
        if isinstance(self.shard_tokens, bool) or not isinstance(self.shard_tokens, int):
            raise ConfigError(f"shard_tokens must be an integer, not {self.shard_tokens!r}")
        limit = FORMATS[self.format].max_tokens
        if not 1 <= self.shard_tokens <= limit:
            why = "2**31 - 1; --format bin holds more" if limit == MAX_SHARD_TOKENS else "2**63 - 1"
            raise ConfigError(
                f"shard_tokens={self.shard_tokens} is out of range; a shard holds 1 to {limit} tokens "
                f"in format {self.format} ({why})"
            )
        if self.boundary not in BOUNDARY_PLACEMENTS:
            raise ConfigError(f"boundary must be 'bos' or 'eos' (or 'both': BOS + ids + EOS), not {self.boundary!r}")
        for field_name, flag, kind in (("bos_token", "--bos-token", "bos"), ("eos_token", "--eos-token", "eos")):
            value = getattr(self, field_name)
            if value is None:
                continue
            if isinstance(value, int) and not isinstance(value, bool):
                value = str(value)  # an id given as a number: stored as its digits, as the CLI gives it
                object.__setattr__(self, field_name, value)
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{field_name} ({flag}) must be a token's text or id, not {value!r}")
            if self.boundary not in (kind, "both"):
                other = "--bos" if kind == "bos" else "--eos"
                raise ConfigError(
                    f"{flag} {value} is given but boundary={self.boundary!r} places no {kind.upper()} token; "
                    f"add {other} (with --bos --eos each document is BOS + ids + EOS)"
                )
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
        if self.on_bad_record not in ("fail", "skip"):
            raise ConfigError(f"on_bad_record must be 'fail' or 'skip', not {self.on_bad_record!r}")
        if self.stats_column is not None and (not isinstance(self.stats_column, str) or not self.stats_column):
            raise ConfigError(f"stats_column (--stats-column) must be a column name, not {self.stats_column!r}")
        if self.unit_bytes < 1 or self.batch_rows < 1 or self.batch_bytes < 1:
            raise ConfigError("unit_bytes, batch_bytes and batch_rows must be positive")
        for switch, flag in (("stats", "--no-stats"), ("card", "--no-card")):
            if not isinstance(getattr(self, switch), bool):
                raise ConfigError(f"{switch} ({flag}) must be true or false, not {getattr(self, switch)!r}")
        if not self.stats:
            # No statistics, nothing to draw: one spelling of "neither", so one build key.
            object.__setattr__(self, "card", False)

    def _resolve_target_options(self) -> None:
        """Set the target options left unset: the target's values (explicit ones must agree), or the defaults."""
        given = {k: getattr(self, k) for k in TARGET_DEFAULTS}
        object.__setattr__(self, "_unset", frozenset(k for k, v in given.items() if v is None))
        resolved = get_target(self.target).resolve(given) if self.target is not None else given
        for option, default in TARGET_DEFAULTS.items():
            value = resolved.get(option)
            object.__setattr__(self, option, default if value is None else value)

    @property
    def has_val(self) -> bool:
        return bool(self.val_fraction or self.val_count)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        del d["_unset"]
        d["sources"] = list(self.sources)
        # Unset boundary tokens (the tokenizer's defaults) are left out, so that the
        # manifests and build keys of configurations that predate them stay the same.
        for name in _OMITTED_WHEN_NONE:
            if d[name] is None:
                del d[name]
        # Added after versions were published: at their defaults they are left out, so that
        # their build keys and manifests stay the same (``from_dict`` reads a missing one as the default).
        for name, default in _OMITTED_AT_DEFAULT.items():
            if d[name] == default:
                del d[name]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BuildConfig":
        d = dict(d)
        # Manifests written before the unused ``extra`` option was removed record it empty.
        if d.get("extra", None) == {}:
            del d["extra"]
        known = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown build options: {', '.join(unknown)}")
        d["sources"] = tuple(d.get("sources", ()))
        return cls(**d)

    def key_fields(self) -> dict[str, Any]:
        """The options that determine the output bytes (see ``_NOT_IN_BUILD_KEY``)."""
        fields = {k: v for k, v in self.to_dict().items() if k not in _NOT_IN_BUILD_KEY}
        fields["embed"] = None if self.embed is None else self.embed.key_fields()
        # The key payload of every version published so far held the option ``extra``
        # (never used, since removed) as an empty dict; kept, so that their keys stay valid.
        fields["extra"] = {}
        return fields

    def reuse_fields(self) -> dict[str, Any]:
        """The key fields that determine the token shards: a parent version whose fields equal these
        (and whose tokenizer and boundaries do) lends its tokens to an incremental build.

        The embeddings, the statistics and the card are made from the tokens, so a parent built with
        other settings of them still lends its tokens (an incremental version of a parent without
        statistics says its statistics are incomplete).
        """
        return {k: v for k, v in self.key_fields().items() if k not in _NOT_IN_TOKENS}

    def replace(self, **changes: Any) -> "BuildConfig":
        """A copy with ``changes``; options that were never given stay unset, so a new ``target`` sets them."""
        unset = {k: None for k in self._unset if k not in changes}
        return dataclasses.replace(self, **unset, **changes)
