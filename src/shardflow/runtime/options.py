"""The options the runtime's readers share, written and checked once: ``ReadOptions``.

    opts = ReadOptions(split="train", seq_len=1024)
    ds = TokenDataset("wikitext@latest", options=opts)     # == TokenDataset(..., split="train", seq_len=1024)
    it = StreamingTokenDataset("wikitext@latest", options=opts, seed=1, rank=1, world_size=8)

``open_shards``, ``TokenDataset``, ``StreamingTokenDataset`` and
``MixtureDataset`` take these options as keyword arguments, as ``options=``,
or both: a keyword sets a field that ``options`` leaves at its default. Each
takes the fields it uses (``*_OPTIONS`` below) and refuses any other one that
is set, a name that is no option, and a field given both ways.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import Any, Literal, get_args

import numpy as np

from ..catalog import Catalog
from ..errors import ConfigError
from ..formats import FORMATS
from ..formats.base import TOKEN_DTYPES

__all__ = ["ReadOptions", "check_int", "shown", "SHARD_OPTIONS", "REMOTE_OPTIONS", "DATASET_OPTIONS", "STREAM_OPTIONS", "MIXTURE_OPTIONS"]

Overflow = Literal["skip", "continue"]
AlignRule = Literal["shardflow", "nemo"]
Boundary = Literal["bos", "eos", "both"]

PLAIN_OPTIONS = ("dtype", "format", "pattern", "boundary_token", "boundary")
"""The options that describe a plain directory of shards (a version's manifest records them)."""
SHARD_OPTIONS = frozenset({"split", "catalog", "verify", *PLAIN_OPTIONS})
"""``open_shards``'s."""
REMOTE_OPTIONS = SHARD_OPTIONS | {"cache_dir"}
"""``open_remote_split``'s."""
DATASET_OPTIONS = REMOTE_OPTIONS | {"cache_limit_bytes", "seq_len", "pack_sequences", "align_to_bos", "overflow", "align_rule"}
"""``TokenDataset``'s."""
_EPOCHS = {"seed", "shuffle", "shuffle_group", "rank", "world_size", "worker_id", "num_workers", "block_size", "drop_last", "infinite"}
STREAM_OPTIONS = (DATASET_OPTIONS - {"align_rule"}) | _EPOCHS
"""``StreamingTokenDataset``'s."""
MIXTURE_OPTIONS = frozenset({"split", "catalog", "verify", "cache_dir", "seq_len", "pack_sequences", "align_to_bos", "overflow",
                             "samples_per_epoch", *_EPOCHS})
"""``MixtureDataset``'s."""

# Integer options and their minimums, checked in this order; the first three may be None.
_MINIMUMS = {"seq_len": 1, "cache_limit_bytes": 1, "samples_per_epoch": 1, "world_size": 1, "rank": 0,
             "num_workers": 1, "worker_id": 0, "block_size": 1, "seed": 0, "shuffle_group": 1}


def shown(value: Any) -> str:
    """``repr(value)`` for a message, never raising and never long (Python refuses to print an int of over 4,300
    digits: a number that large is named by its size)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and abs(int(value)).bit_length() > 64:
        return f"a {abs(int(value)).bit_length()}-bit {'negative ' if value < 0 else ''}number"
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a value whose repr fails is still named
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


def check_int(name: str, value: Any, *, minimum: int, maximum: int | None = None) -> int:
    """``value`` as an int, refused (``ValueError``) unless it is an integer (not a bool) from ``minimum`` to
    ``maximum`` (when given)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, not {shown(value)}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, not {shown(value)}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be at most {maximum:,}, not {shown(value)}")
    return int(value)


@dataclass(frozen=True, kw_only=True)
class ReadOptions:
    """The reading options of ``open_shards`` and the datasets, checked when made (see the module docstring).

    ``split``, ``catalog``, ``verify``: which shards. ``dtype``, ``format``,
    ``pattern``, ``boundary_token``, ``boundary``: how to read a plain
    directory of them. ``cache_dir``, ``cache_limit_bytes``: the local cache of a
    version on object storage. ``seq_len``, ``pack_sequences``,
    ``align_to_bos``, ``overflow``, ``align_rule``: the samples. The rest: the
    epoch stream, its ranks and workers (``samples_per_epoch``: a mixture's).
    """

    split: str = "train"
    catalog: Catalog | str | os.PathLike[str] | None = None
    verify: bool = False
    dtype: str | np.dtype | None = None
    format: str | None = None
    pattern: str | None = None
    boundary_token: int | None = None
    boundary: Boundary | None = None
    cache_dir: str | os.PathLike[str] | None = None
    cache_limit_bytes: int | None = None
    seq_len: int | None = None
    pack_sequences: bool = False
    align_to_bos: bool = False
    overflow: Overflow = "skip"
    align_rule: AlignRule = "shardflow"
    seed: int = 0
    shuffle: bool = True
    shuffle_group: int = 8
    rank: int = 0
    world_size: int = 1
    worker_id: int = 0
    num_workers: int = 1
    block_size: int = 1
    drop_last: bool = False
    infinite: bool = False
    samples_per_epoch: int | None = None

    def __post_init__(self) -> None:
        # Stored normalized (plain ints and bools, a little-endian dtype), as the readers use them.
        normal: dict[str, Any] = {}
        for name, minimum in _MINIMUMS.items():
            value = getattr(self, name)
            if value is not None or name not in ("seq_len", "cache_limit_bytes", "samples_per_epoch"):
                normal[name] = check_int(name, value, minimum=minimum)
        for name in ("verify", "pack_sequences", "align_to_bos", "shuffle", "drop_last", "infinite"):
            normal[name] = bool(getattr(self, name))
        if normal["rank"] >= normal["world_size"]:
            raise ValueError(f"rank={self.rank} must be below world_size={self.world_size} (ranks are 0 to {self.world_size - 1})")
        if normal["worker_id"] >= normal["num_workers"]:
            raise ValueError(f"worker_id={self.worker_id} must be below num_workers={self.num_workers}")
        if self.overflow not in get_args(Overflow):
            raise ValueError(f"overflow must be 'skip' or 'continue', not {self.overflow!r}")
        if self.overflow == "continue" and not self.align_to_bos:
            raise ValueError("overflow='continue' only applies with align_to_bos=True (without it, windows ignore documents)")
        if self.align_rule not in get_args(AlignRule):
            raise ValueError(f"align_rule must be 'shardflow' or 'nemo', not {self.align_rule!r}")
        if self.align_rule == "nemo" and self.overflow != "skip":
            raise ValueError("align_rule='nemo' cuts documents as NeMo does: use it with overflow='skip'")
        if (self.boundary or "bos") not in get_args(Boundary):
            raise ConfigError(f"boundary must be 'bos' or 'eos' (or 'both': BOS + ids + EOS), not {self.boundary!r}")
        if self.boundary_token is not None:
            if isinstance(self.boundary_token, bool) or not isinstance(self.boundary_token, (int, np.integer)):
                raise ConfigError(f"boundary_token must be a token id (an int), not {self.boundary_token!r}")
            normal["boundary_token"] = int(self.boundary_token)
        if self.dtype is not None:
            try:
                normal["dtype"] = np.dtype(self.dtype).newbyteorder("<")
            except TypeError:
                raise ConfigError(f"dtype {self.dtype!r} is not a NumPy dtype; use 'uint16' or 'uint32'") from None
            if normal["dtype"] not in TOKEN_DTYPES.values():
                raise ConfigError(f"dtype must be uint16 or uint32, not {np.dtype(self.dtype)}")
        if self.format is not None and self.format not in FORMATS:
            raise ConfigError(f"unknown shard format {self.format!r}; use one of {', '.join(FORMATS)}")
        for name, value in normal.items():
            object.__setattr__(self, name, value)

    def set_fields(self) -> set[str]:
        """The names of the fields not at their defaults."""
        return {
            f.name for f in fields(self)
            if (getattr(self, f.name) is not None if f.default is None else getattr(self, f.name) != f.default)
        }

    def plain_given(self) -> list[str]:
        """The plain-directory options that are set, in ``PLAIN_OPTIONS`` order (a version refuses them)."""
        return [name for name in PLAIN_OPTIONS if getattr(self, name) is not None]

    def only(self, names: frozenset[str], **changes: Any) -> "ReadOptions":
        """A copy with every field outside ``names`` at its default, then ``changes`` made: what to pass on to
        a reader that takes ``names``."""
        return replace(self, **{**{f.name: f.default for f in fields(self) if f.name not in names}, **changes})

    @classmethod
    def collect(cls, caller: str, accepted: frozenset[str], options: "ReadOptions | None", given: dict[str, Any]) -> "ReadOptions":
        """The options of a call of ``caller``, which takes the fields ``accepted``: ``options`` (or the
        defaults) with the keyword arguments ``given`` set."""
        unknown = [name for name in given if name not in accepted]
        if unknown:  # as Python says it for a keyword a signature does not have
            raise TypeError(f"{caller}() got an unexpected keyword argument {unknown[0]!r}")
        if options is None:
            return cls(**given)
        if not isinstance(options, ReadOptions):
            raise TypeError(f"{caller}(options=...) takes a ReadOptions, not {type(options).__name__}")
        already = options.set_fields()
        both = [name for name in given if name in already]
        if both:
            raise TypeError(f"{caller}() got {', '.join(both)} both in options and as a keyword argument; give each option once")
        other = sorted(already - accepted)
        if other:
            raise TypeError(f"{caller}() does not take {', '.join(other)}, which the given options set")
        return replace(options, **given) if given else options
