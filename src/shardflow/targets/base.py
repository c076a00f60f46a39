"""A trainer target: what one training stack's own reader needs from a version, and the settings it prints.

A ``Target`` fixes (or restricts) the format, the boundary placement, the
dtype and the file layout of a build so that the stack's reader loads a split
directory as it is, refuses up front what that reader cannot read, and writes
the stack's settings for a published version (``settings``). One module per
target builds its ``Target``; ``TARGETS`` in ``targets/__init__.py`` lists them.

Pure: it imports no build code, so ``BuildConfig`` can resolve a target when it
is made, and the plan can check the tokenizer's facts against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from ..errors import ConfigError
from ..formats import get_format
from ..formats.base import MAX_SHARD_TOKENS
from ..manifest import Manifest
from .settings_support import header

__all__ = ["Target", "default_shard_path", "OPTION_FLAGS"]

# The build options a target decides, and the flag that sets each on the command line.
OPTION_FLAGS = {"format": "--format", "boundary": "--bos/--eos", "shard_tokens": "--shard-tokens"}
_BOUNDARY_FLAGS = {"bos": "--bos", "eos": "--eos", "both": "--bos --eos"}


def default_shard_path(name: str, split: str, index: int, extension: str) -> str:
    """``SPLIT/NAME_SPLIT_000007.EXT``: one directory per split; zero-padded, so sorting gives manifest order."""
    return f"{split}/{name}_{split}_{index:06d}.{extension}"


@dataclass(frozen=True, kw_only=True)
class Target:
    """One training stack's reader, as rules on a build (see the module docstring)."""

    name: str
    stack: str
    """The stack and the reader, as a user knows them: ``modded-nanogpt (train_gpt.py, llm.c)``."""
    formats: tuple[str, ...]
    """Formats its reader loads; the first is the target's default."""
    boundaries: tuple[str, ...]
    """Boundary placements its reader handles; the first is the default."""
    dtypes: tuple[str, ...] = ("uint16", "uint32")
    """Token dtypes its reader loads; a tokenizer needing another is refused while planning."""
    boundary_id: int | None = None
    """A boundary token id the reader hard-codes (modded-nanogpt's 50256), or None."""
    one_file_per_split: bool = False
    """The reader loads one fixed file per split (nanoGPT's train.bin / val.bin)."""
    gathers: bool = False
    """The reader drops up to a global batch at every shard's end, so shards of one work unit each (small
    inputs: small shards) would waste more than 1% of the tokens: every split is gathered into shards of
    ``shard_tokens`` instead (a second write of the tokens; ``pipeline/layout.py``)."""
    train_files_at_least: int = 1
    """The reader opens this many train files before its first batch (modded-nanogpt's BOS-aligned loader
    loads the next file ahead, and fails on a train split in one file): a gathered train split that
    ``shard_tokens`` would leave in fewer files is cut at documents into about this many equal ones."""
    globs_split_dir: bool = True
    """The reader finds a split's shards by a glob over a directory (so that directory must hold only them);
    False where the settings list every shard (OLMo-core's paths, Megatron's prefixes)."""
    hf_tokenizer: bool = False
    """The settings name the version's ``hf_tokenizer/`` (what ``AutoTokenizer`` loads; see
    ``targets.hf_tokenizer``), so a build for this target writes it."""
    settings_title: str
    """The stack and what its settings fill, as their first line names them: ``nanoGPT (train.py)``."""
    settings_lines: Callable[[Manifest, Path], Iterable[str]]
    """The stack's settings for a version (its manifest and directory), below the header every target prints."""
    file_name: Callable[[str, str, int, str], str] = default_shard_path
    """The shard's path in the version directory, from (dataset name, split, shard index, extension)."""

    def __post_init__(self) -> None:
        if not self.formats or not self.boundaries or not self.dtypes:
            raise ValueError(f"target {self.name!r}: formats, boundaries and dtypes must not be empty")

    def _fixed(self, option: str) -> tuple[Any, ...]:
        return {"format": self.formats, "boundary": self.boundaries}.get(option, ())

    def one_file_tokens(self, fmt: str | None) -> int:
        """The ``shard_tokens`` of a one-file-per-split build in format ``fmt`` (None: the target's default):
        the most one file of that format holds, "unlimited" for a headerless ``bin``."""
        return get_format(fmt or self.formats[0]).max_tokens

    def check_given(self, given: dict[str, Any]) -> None:
        """Refuse an option given explicitly (``given``: option -> value, None: not given) that contradicts this target."""
        for option, value in given.items():
            if value is None:
                continue
            allowed = self._fixed(option)
            if allowed and value not in allowed:
                given_as = _BOUNDARY_FLAGS[value] if option == "boundary" else f"{OPTION_FLAGS[option]} {value}"
                raise ConfigError(
                    f"--target {self.name} writes what {self.stack} reads: {option} "
                    f"{' or '.join(map(str, allowed))}, so {given_as} contradicts it; "
                    f"drop {OPTION_FLAGS[option]} (or choose another --target)"
                )
            # MAX_SHARD_TOKENS: what versions built before int64 .bos.idx entries recorded (their configs reopen).
            if (
                option == "shard_tokens"
                and self.one_file_per_split
                and value not in (self.one_file_tokens(given.get("format")), MAX_SHARD_TOKENS)
            ):
                raise ConfigError(
                    f"--target {self.name} writes one file per split ({self.stack} loads exactly those), "
                    "so --shard-tokens does not apply; drop it"
                )

    def resolve(self, given: dict[str, Any]) -> dict[str, Any]:
        """The values of the options this target decides: ``given`` (option -> value, None: not given)
        checked against the target, and the unset ones set to the target's (``shard_tokens`` only where
        the target writes one file per split: the caller keeps its own default otherwise).
        """
        self.check_given(given)
        values = {k: v for k, v in given.items() if v is not None}
        for option in ("format", "boundary"):
            values.setdefault(option, self._fixed(option)[0])
        if self.one_file_per_split:
            values.setdefault("shard_tokens", self.one_file_tokens(values["format"]))
        return values

    def check_shard_counts(self, shards: dict[str, int], *, shard_tokens: int, fmt: str) -> None:
        """Refuse, at the layout (before any shard is written), a split that one file per split cannot hold.

        With the target's own ``shard_tokens`` only a format whose one file has a limit (an int32 token
        count in its header) can trigger it; a headerless ``bin`` file holds any split. A config recorded
        before int64 ``.bos.idx`` entries (``shard_tokens`` 2**31 - 1) still can.
        """
        if not self.one_file_per_split:
            return
        most = self.one_file_tokens(fmt)
        how = (
            f"rebuild without shard_tokens (one {fmt} file holds up to {most:,} tokens)"
            if shard_tokens < most
            else "use --target olmo-core or kempnerforge for a corpus this large"
        )
        for split, count in shards.items():
            if count > 1:
                raise ConfigError(
                    f"--target {self.name} writes one {split} file ({self.stack} loads exactly that), but split "
                    f"{split!r} holds more than shard_tokens={shard_tokens:,} tokens; {how}"
                )

    def check_tokens(self, *, dtype: str, vocab_size: int, bos_id: int | None, eos_id: int | None, tokenizer: str) -> None:
        """Refuse, while planning, a tokenizer whose ids this stack cannot read."""
        if dtype not in self.dtypes:
            raise ConfigError(
                f"--target {self.name}: {self.stack} reads {' or '.join(self.dtypes)} tokens only, but {tokenizer} "
                f"has {vocab_size} ids and needs {dtype}; use a tokenizer of at most 65,536 ids (a GPT-2-sized "
                "vocabulary), or another --target (olmo-core, kempnerforge, nemo, megatron read uint32)"
            )
        if self.boundary_id is not None:
            found = bos_id if bos_id is not None else eos_id
            if found != self.boundary_id:
                raise ConfigError(
                    f"--target {self.name}: {self.stack} hard-codes the document boundary id {self.boundary_id}, "
                    f"but the boundary token of {tokenizer} is {found}; use a tokenizer whose <|endoftext|> is "
                    f"{self.boundary_id} (GPT-2's), or pass --bos-token {self.boundary_id} if that id is your "
                    "boundary token"
                )

    def version_problems(self, manifest: Manifest) -> list[str]:
        """Why this stack's reader would not load a published version as it is (empty when it would)."""
        problems = []
        if manifest.format_name not in self.formats:
            problems.append(f"its format is {manifest.format_name}, {self.stack} reads {' or '.join(self.formats)}")
        bt = manifest.boundary_tokens
        if bt.placement not in self.boundaries:
            problems.append(f"its boundary placement is {bt.placement}, {self.stack} needs {' or '.join(self.boundaries)}")
        if manifest.dtype not in self.dtypes:
            problems.append(f"its tokens are {manifest.dtype}, {self.stack} reads {' or '.join(self.dtypes)}")
        if self.boundary_id is not None:
            found = bt.bos[1] if bt.bos else (bt.eos[1] if bt.eos else None)
            if found != self.boundary_id:
                problems.append(f"its boundary id is {found}, {self.stack} hard-codes {self.boundary_id}")
        for split, entry in manifest.splits.items():
            names = [s.file for s in entry.shards]
            if self.one_file_per_split:
                want = self.file_name(manifest.name, split, 0, manifest.tokenized_info.get("file_extension", "bin"))
                if names != [want]:
                    problems.append(f"split {split!r} is not the one file {want} that {self.stack} loads")
            elif self.globs_split_dir and any("/" not in n for n in names):
                problems.append(
                    f"split {split!r} shares the version directory with other files (a version of manifest schema 1), "
                    f"so a glob over it picks up more than the split's shards"
                )
        return problems

    def settings(self, manifest: Manifest, directory: Path | str) -> str:
        """The settings ``stack`` needs to train on this version, as text to paste."""
        return "\n".join([*header(self.settings_title, manifest), *self.settings_lines(manifest, Path(directory))])
