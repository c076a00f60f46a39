"""The checks of one shard's tokens against its document index, on arrays: as a build writes it, and as
``shardflow validate`` reads it back.

``ShardScan`` is fed the shard's tokens block by block, in order: the arrays a writer is about to write
(``formats/writer.ShardWriter``, ``formats/unit_writer.UnitShardWriter``: the build's check at write
time, before the file is committed) or the blocks ``validation.validate_shard_entry`` reads back from a
file. The same code runs both ways:

* every token id is below the vocabulary size (``feed`` stops at the first that is not);
* the index's entries (``problems(starts)``) are the document starts the boundary tokens mark: at BOS
  tokens with BOS placement (and every BOS is indexed), right after EOS tokens with EOS placement (and
  every EOS is followed by one), at BOS tokens preceded by the EOS (inside the shard) with both;
* a shard of whole documents (manifest schema 3) begins with a document and, unless BOS alone marks
  documents, ends with the EOS.

``ShardContext`` holds the version's facts these checks need: from a manifest (``of_manifest``) or, in a
build, from its plan alone (``pipeline/check.shard_context``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .errors import ValidationError
from .formats import get_format
from .manifest import Manifest, ShardEntry, version_file

__all__ = ["ShardContext", "ShardScan"]


def _nothing() -> int | None:
    return None


@dataclass(frozen=True, kw_only=True)
class ShardContext:
    """What checking one shard needs besides its own manifest entry: the version's facts, and for shards cut
    across documents (schemas 1 and 2) lookups of the two neighbours' edge tokens.

    Built from a manifest (``of_manifest``) or, by a build, from its plan alone
    (``pipeline/check.shard_context``: ``whole_documents``, no lookups). The lookups are called only for
    schemas 1 and 2, when a check needs them, and may raise ``ValidationError``, ``OSError`` or ``ValueError``
    when that shard cannot be read (then reported on its own): the check then trusts the index.
    """

    format_name: str
    dtype: str
    vocab_size: int
    boundary: int
    """The manifest's ``boundary.token_id``: the BOS (placements ``bos``, ``both``) or the EOS (``eos``)."""
    placement: str
    bos_id: int | None
    eos_id: int | None
    previous_last: Callable[[], int | None] = _nothing
    """The last token of the shard before this one (None when it is empty); asked only with EOS placement, k > 0."""
    next_first: Callable[[], int | None] = _nothing
    """The first token after this shard in its split (None at the split's end); asked only with placement
    ``both`` and one token as BOS and EOS, when the shard ends with it."""
    whole_documents: bool = True
    """Every shard holds whole documents (manifest schema 3): its first token starts one. False for
    versions of schemas 1 and 2, whose shards were cut across documents."""

    @classmethod
    def of_manifest(
        cls,
        manifest: Manifest,
        *,
        previous_last: Callable[[], int | None] = _nothing,
        next_first: Callable[[], int | None] = _nothing,
    ) -> "ShardContext":
        placement, bos, eos = manifest.boundary_tokens
        return cls(
            format_name=manifest.format_name,
            dtype=manifest.dtype,
            vocab_size=int(manifest.tokenized_info["vocab_size"]),
            boundary=int(manifest.boundary["token_id"]),
            placement=placement,
            bos_id=None if bos is None else bos[1],
            eos_id=None if eos is None else eos[1],
            previous_last=previous_last,
            next_first=next_first,
            whole_documents=manifest.schema_version >= 3,
        )

    def edge_token(self, directory: Path, entry: ShardEntry, *, last: bool, what: str) -> int | None:
        """The first (or last) token id of the shard ``entry`` describes (``what``: which, for messages),
        None when it is empty; reads one page and keeps no map."""
        if entry.tokens == 0:
            return None
        path = version_file(directory, entry.file, what)
        tokens = get_format(self.format_name).open(path, np.dtype(self.dtype).newbyteorder("<"))
        if len(tokens) != entry.tokens:
            raise ValidationError(f"{path}: {len(tokens)} tokens, but {entry.tokens} were expected when it was opened")
        return int(tokens[-1 if last else 0])


class ShardScan:
    """The checks of shard ``k``'s tokens (the file ``path``) against its index (``index_path``), fed in order.

    Keeps one int64 per boundary token, never the tokens: memory follows the documents, not the shard.
    Also the writers' ``TokenCheck`` (``formats/writer.py``): ``feed``, then ``check`` before the commit.
    """

    def __init__(self, ctx: ShardContext, path: Path, index_path: Path, k: int = 0) -> None:
        self.ctx, self.path, self.index_path, self.k = ctx, Path(path), Path(index_path), k
        self.tokens = 0
        """Tokens fed so far."""
        self.last: int | None = None
        self._positions: list[np.ndarray] = []  # where the boundary token is
        self._eos: list[np.ndarray] = []  # where the EOS is (placement both, BOS and EOS distinct)
        self._both_distinct = ctx.placement == "both" and ctx.eos_id != ctx.bos_id

    def feed(self, block: np.ndarray) -> None:
        """The next tokens of the shard; raises ``ValidationError`` at the first id not below the vocabulary size."""
        if not len(block):
            return
        lo = self.tokens
        top = int(block.max())
        if top >= self.ctx.vocab_size:
            at = lo + int(np.argmax(block))
            raise ValidationError(f"{self.path}: token {at} is id {top}, not below the vocabulary size {self.ctx.vocab_size}")
        self._positions.append(np.flatnonzero(block == self.ctx.boundary) + lo)
        if self._both_distinct:
            self._eos.append(np.flatnonzero(block == self.ctx.eos_id) + lo)
        self.last = int(block[-1])
        self.tokens += len(block)

    def check(self, starts: np.ndarray) -> None:
        """``problems(starts)`` as one ``ValidationError`` (none: returns)."""
        problems = self.problems(starts)
        if problems:
            raise ValidationError("\n  ".join(problems))

    def problems(self, starts: np.ndarray) -> list[str]:
        """Every disagreement of the tokens fed (all of the shard's) with the index entries ``starts``."""
        ctx, path, idx_path, n = self.ctx, self.path, self.index_path, self.tokens
        starts = np.asarray(starts)
        problems: list[str] = []
        if ctx.whole_documents and n and (not len(starts) or starts[0] != 0):
            problems.append(
                f"{idx_path}: {path.name} does not begin with a document (its index does not start with 0), but shards "
                "of manifest schema 3 hold whole documents; the shard or its index was changed, or cut by other software"
            )
        placement, boundary, eos_id = ctx.placement, ctx.boundary, ctx.eos_id
        positions = np.concatenate(self._positions) if self._positions else np.empty(0, dtype=np.int64)
        ends: np.ndarray | None = None  # with both: where the EOS tokens are
        if self._both_distinct:
            expected = positions
            ends = np.concatenate(self._eos) if self._eos else np.empty(0, dtype=np.int64)
        elif placement == "both":
            # One token as BOS and EOS: an occurrence is a BOS when the token after it is not
            # that token too (documents are never empty), the next shard's first one at the end.
            after = np.isin(positions + 1, positions)
            if len(positions) and positions[-1] == n - 1:
                after[-1] = ctx.whole_documents or _next_token(ctx) in (None, boundary)
            expected = positions[~after]
            ends = positions[after]
        elif placement == "bos":
            expected = positions
        else:
            after = positions + 1
            expected = after[after < n]
            # With EOS placement token 0 starts a document when the previous shard ends with EOS
            # (schema 3: every shard begins with a document, and no neighbour needs reading).
            first = ctx.whole_documents or _starts_document(ctx, self.k)
            if first is None:  # the previous shard is unreadable (reported on its own): trust the index
                first = bool(len(starts)) and starts[0] == 0
            if first:
                expected = np.concatenate(([0], expected))
        if ctx.whole_documents and n and placement != "bos" and self.last != eos_id:
            problems.append(
                f"{path}: its last token is {self.last}, not the EOS token {eos_id}: its last document is cut short, "
                "but shards of manifest schema 3 hold whole documents"
            )
        if len(expected) != len(starts) or not np.array_equal(expected, starts):
            missing = np.setdiff1d(expected, starts)
            extra = np.setdiff1d(starts, expected)
            what = "BOS" if placement == "both" else placement.upper()
            if len(extra):
                problems.append(
                    f"{idx_path}: entry {int(np.searchsorted(starts, extra[0]))} points at token {int(extra[0])}, "
                    f"which is not a document start ({what} token {boundary} expected)"
                )
            if len(missing):
                problems.append(
                    f"{path}: the document starting at token {int(missing[0])} has no entry in {idx_path.name} "
                    f"({len(missing)} unindexed)"
                )
        if ends is not None:
            problems.extend(self._unclosed(starts, ends))
        return problems

    def _unclosed(self, starts: np.ndarray, ends: np.ndarray) -> list[str]:
        """Both placements: the token before every document start inside the shard closes the previous one."""
        inner = starts[starts > 0].astype(np.int64)
        open_docs = np.setdiff1d(inner - 1, ends)
        if len(open_docs):
            at = int(open_docs[0]) + 1
            return [
                f"{self.index_path}: entry {int(np.searchsorted(starts, at))} points at token {at}, but token {at - 1} "
                f"before it is not the EOS token {self.ctx.eos_id} (placement both: BOS + ids + EOS)"
            ]
        unclosed = np.setdiff1d(ends[ends + 1 < self.tokens] + 1, starts)
        if len(unclosed):
            return [f"{self.path}: the EOS token at {int(unclosed[0])} is not followed by a document start in {self.index_path.name}"]
        return []


def _starts_document(ctx: ShardContext, k: int) -> bool | None:
    """With EOS placement: whether shard ``k`` begins a document (None when the shard before cannot be read)."""
    if k == 0:
        return True
    try:
        last = ctx.previous_last()
    except (ValidationError, OSError, ValueError):
        return None
    return last is not None and last == ctx.boundary


def _next_token(ctx: ShardContext) -> int | None:
    """The first token after the shard in its split (None at the split's end or when unreadable)."""
    try:
        return ctx.next_first()
    except (ValidationError, OSError, ValueError):
        return None
