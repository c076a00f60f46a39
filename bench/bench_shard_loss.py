"""Benchmark: the tokens each trainer target's own reader drops at shard ends, at the settings ``--target`` prints.

    python bench/bench_shard_loss.py --corpus /tmp/bench/c1000          # one build per target (workers=2), then each rule
    python bench/bench_shard_loss.py --version NAME@vN --catalog DIR    # every rule on one published version

Computed from the manifest's token count per shard and each shard's ``.bos.idx``
(document starts) only, never by running a trainer. Each reader's rule, from its
own loading code (the same stacks as tests/targets/spec_readers.py):

* modded-nanogpt ``distributed_data_generator`` (BOS-aligned ``BOSFinder``): a batch
  fills each of ``ranks`` ranks with ``rank_tokens + 1`` tokens of BOS-started pieces
  (a document cut at ``max_seq_len`` and where the rank is full; the rest of it is
  skipped); when the shard's documents run out before a whole batch is filled, the
  rest of the shard, from the first document of that batch on, is dropped and the
  next shard is loaded. A shard smaller than one batch is skipped whole. Defaults:
  a global batch of 8 x 64 x 1024 tokens (8 ranks of 65,536), ``max_seq_len`` 2048
  (``train_max_seq_len`` of its current ``train_gpt.py``: documents are cut at it).
* NeMo Automodel ``NanogptDataset`` (``align_to_bos: true``, ``seq_len: 1024`` as
  printed): a sample at a BOS ``s`` with ``s + seq_len + 1`` tokens left in the shard,
  the next at the first BOS at or after ``s + seq_len + 1``; what follows the shard's
  last sample is dropped.
* KempnerForge ``MemoryMappedDataset``: each file holds ``len // (seq_len + 1)``
  samples (``seq_len`` 2048, its ``TrainConfig`` default, + 1 for the label), so each
  file's remainder is dropped.
* OLMo-core ``NumpyFSLDataset`` (``sequence_length=2048`` as printed): each file holds
  ``tokens // sequence_length`` instances; each file's remainder is dropped.
* Megatron-LM ``GPTDataset``: ``--per-split-data-args-path`` lists prefixes without
  weights, so each prefix (shard) is its own dataset of one epoch, and its samples of
  ``seq_length + 1`` tokens (``--seq-length 4096`` as printed; consecutive samples
  share one token) leave ``(n - 1) mod seq_length`` tokens of each shard unread; a
  sample may span documents, so nothing else is dropped.
* nanoGPT ``train.py``: one file per split, random windows anywhere in it: nothing.

Tokens before a shard's first document start (a document continued from the
previous shard, in versions whose documents span shards) are never read by the
BOS-aligned readers: they count as lost too. ``as one file`` applies the same rule
to the split as one file: the least any sharding can lose.

With ``--corpus`` each target's version is built with the tokenizer its stack
takes: cl100k_base, and for the uint16 stacks (modded-nanogpt, nanoGPT) a
GPT-2-sized vocabulary, cl100k's first 50,256 ranks (as tests/targets/conftest.py),
so that ``<|endoftext|>`` is 50256. It prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

GPT2_SIZED_RANKS = 50_256
UINT16_TARGETS = ("modded-nanogpt", "nanogpt")


@dataclass(frozen=True, kw_only=True)
class ReaderDefaults:
    """The reader settings the rules use: what each target's printed settings (or its stack's defaults) say."""

    modded_ranks: int = 8
    modded_rank_tokens: int = 64 * 1024
    modded_max_seq_len: int | None = 2048
    nemo_seq_len: int = 1024
    kempnerforge_seq_len: int = 2048
    olmo_core_sequence_length: int = 2048
    megatron_seq_length: int = 4096


# -- the rules: tokens one shard of `n` tokens with document starts `starts` loses --------------------------


def modded_nanogpt_lost(n: int, starts: np.ndarray, *, ranks: int, rank_tokens: int, max_seq_len: int | None) -> int:
    """Tokens of the shard that modded-nanogpt's BOS-aligned loader never puts in a batch because the shard ends.

    ``BOSFinder.next_batch``: rank by rank, pieces start at the next BOS and end at
    the following BOS, ``max_seq_len`` later, or where the rank has its
    ``rank_tokens + 1`` tokens, whichever is first; running out of BOS positions
    mid-batch drops the rest of the shard from the batch's first document on.
    Vectorized: a rank starting at document ``j`` ends after the first ``k`` with
    ``capped[j:k].sum() >= rank_tokens + 1``, found on the cumulative sums.
    """
    starts = np.asarray(starts, dtype=np.int64)
    if not len(starts):
        return n
    lengths = np.diff(np.append(starts, n))
    if max_seq_len is not None:
        lengths = np.minimum(lengths, max_seq_len)
    cum = np.concatenate(([0], np.cumsum(lengths)))
    need = rank_tokens + 1
    first = 0  # the first document of the next batch
    while True:
        j = first
        for _ in range(ranks):
            j = int(np.searchsorted(cum, cum[j] + need, side="left"))
            if j >= len(cum):
                # Tokens before the first BOS (a continued document) are never read either.
                return int(starts[0]) + (n - int(starts[first]) if first < len(starts) else 0)
        first = j
        if first >= len(starts):
            return int(starts[0])


def nemo_lost(n: int, starts: np.ndarray, *, seq_len: int) -> int:
    """Tokens after NeMo ``NanogptDataset``'s last BOS-aligned sample of the shard (and before its first BOS)."""
    starts = np.asarray(starts, dtype=np.int64)
    window = seq_len + 1
    end = None
    i = 0
    while i < len(starts) and int(starts[i]) + window <= n:
        end = int(starts[i]) + window
        i = int(np.searchsorted(starts, end, side="left"))
    if end is None:
        return n
    return int(starts[0]) + n - end


def remainder_lost(n: int, window: int) -> int:
    """A reader of ``n // window`` fixed windows per file (KempnerForge, OLMo-core): the remainder."""
    return n % window


def megatron_lost(n: int, seq_length: int) -> int:
    """One epoch of one prefix: ``(n - 1) // seq_length`` samples of ``seq_length + 1`` tokens sharing one each."""
    samples = (n - 1) // seq_length if n > 0 else 0
    return n - (samples * seq_length + 1) if samples else n


@dataclass(frozen=True, kw_only=True)
class Rule:
    target: str
    text: str
    lost: Callable[[int, np.ndarray], int]
    needs_starts: bool


def rules(d: ReaderDefaults) -> dict[str, Rule]:
    """Each target's rule at the reader settings ``d``."""
    cap = "no cap" if d.modded_max_seq_len is None else f"max_seq_len {d.modded_max_seq_len}"
    return {
        "modded-nanogpt": Rule(
            target="modded-nanogpt",
            text=f"tail after the last full BOS-aligned batch of {d.modded_ranks} x {d.modded_rank_tokens} ({cap})",
            lost=lambda n, s: modded_nanogpt_lost(n, s, ranks=d.modded_ranks, rank_tokens=d.modded_rank_tokens,
                                                  max_seq_len=d.modded_max_seq_len),
            needs_starts=True,
        ),
        "nanogpt": Rule(target="nanogpt", text="one file, random windows: none", lost=lambda n, s: 0,
                        needs_starts=False),
        "nemo": Rule(target="nemo", text=f"after the last BOS-aligned sample of seq_len {d.nemo_seq_len} + 1",
                     lost=lambda n, s: nemo_lost(n, s, seq_len=d.nemo_seq_len), needs_starts=True),
        "kempnerforge": Rule(target="kempnerforge", text=f"each file mod (seq_len {d.kempnerforge_seq_len} + 1)",
                             lost=lambda n, s: remainder_lost(n, d.kempnerforge_seq_len + 1), needs_starts=False),
        "olmo-core": Rule(target="olmo-core", text=f"each file mod sequence_length {d.olmo_core_sequence_length}",
                          lost=lambda n, s: remainder_lost(n, d.olmo_core_sequence_length), needs_starts=False),
        "megatron": Rule(target="megatron", text=f"each prefix (n - 1) mod seq_length {d.megatron_seq_length}",
                         lost=lambda n, s: megatron_lost(n, d.megatron_seq_length), needs_starts=False),
    }


def split_loss(rule: Rule, sizes: list[int], starts: list[np.ndarray]) -> dict:
    """The rule over a split's shards, and over the same tokens as one file."""
    lost = [rule.lost(int(n), s) for n, s in zip(sizes, starts)]
    offsets = np.concatenate(([0], np.cumsum(sizes, dtype=np.int64)))
    joined = (np.concatenate([np.asarray(s, dtype=np.int64) + o for s, o in zip(starts, offsets)])
              if starts else np.empty(0, dtype=np.int64))
    total = int(offsets[-1])
    return {
        "shards": len(sizes),
        "tokens": total,
        "lost": int(sum(lost)),
        "percent": 100 * sum(lost) / total if total else 0.0,
        "lost_as_one_file": int(rule.lost(total, joined)),
        "shard_tokens_min": int(min(sizes)) if sizes else 0,
        "shard_tokens_median": float(statistics.median(sizes)) if sizes else 0.0,
        "shard_tokens_max": int(max(sizes)) if sizes else 0,
        "shards_lost_whole": sum(1 for n, lo in zip(sizes, lost) if n and lo == n),
    }


def version_shards(ref: str, catalog: str | None, split: str, with_starts: bool) -> tuple[str, list[int], list[np.ndarray]]:
    """A published version's ``(ref, token count per shard, document starts per shard)`` of ``split``."""
    from shardflow.reader import open_version

    version = open_version(ref, catalog=catalog)
    shards = version.split(split).shards
    sizes = [int(n) for n in shards.tokens]
    starts = [np.asarray(shards.doc_starts(k, cache=False), dtype=np.int64) if with_starts else
              np.empty(0, dtype=np.int64) for k in range(shards.num_shards)]
    return version.ref, sizes, starts


def gpt2_sized(work: Path) -> Path:
    """A ``.tiktoken`` rank file of cl100k's first 50,256 ranks: ``<|endoftext|>`` gets the id 50256."""
    import tiktoken_ext

    path = work / "gpt2sized.tiktoken"
    if not path.is_file():
        full = Path(list(tiktoken_ext.__path__)[0]) / "data" / "cl100k_base.tiktoken"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(b"\n".join(full.read_bytes().splitlines()[:GPT2_SIZED_RANKS]) + b"\n")
        tmp.replace(path)
    return path


def build_for(target: str, corpus: Path, work: Path, val_fraction: float) -> tuple[str, str]:
    """Build ``corpus`` with ``--target target`` (workers=2); ``(ref, catalog)``."""
    from shardflow.pipeline import build
    from shardflow.config import BuildConfig

    tokenizer = str(gpt2_sized(work)) if target in UINT16_TARGETS else "cl100k_base"
    root = work / target
    shutil.rmtree(root, ignore_errors=True)
    result = build(
        BuildConfig(name=f"loss-{target}", sources=(str(corpus),), tokenizer=tokenizer, target=target,
                    val_fraction=val_fraction),
        data_root=root / "data", catalog=root / "manifests", workers=2,
    )
    return result.ref, str(root / "manifests")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--corpus", type=Path, help="build this corpus once per target, each with its own rule")
    src.add_argument("--version", metavar="REF", help="a published version: every rule on its shards")
    ap.add_argument("--catalog", help="the catalog of --version (default: the configured one)")
    ap.add_argument("--targets", default=None, help="comma-separated targets (default: all of shardflow.targets.TARGETS)")
    ap.add_argument("--split", default="train")
    ap.add_argument("--val-fraction", type=float, default=0.0, help="with --corpus: the builds' --val-fraction")
    ap.add_argument("--workdir", type=Path, help="with --corpus: where the versions go (default: a temporary directory)")
    ap.add_argument("--keep", action="store_true", help="with --corpus: keep the built versions")
    ap.add_argument("--modded-ranks", type=int, default=8)
    ap.add_argument("--modded-rank-tokens", type=int, default=64 * 1024)
    ap.add_argument("--modded-max-seq-len", type=int, default=2048, help="0: no cap")
    args = ap.parse_args()

    from shardflow.targets import TARGETS

    names = args.targets.split(",") if args.targets else list(TARGETS)
    unknown = [t for t in names if t not in TARGETS]
    if unknown:
        sys.exit(f"--targets: unknown {', '.join(unknown)}; use some of {', '.join(TARGETS)}")
    defaults = ReaderDefaults(modded_ranks=args.modded_ranks, modded_rank_tokens=args.modded_rank_tokens,
                              modded_max_seq_len=args.modded_max_seq_len or None)
    table = rules(defaults)
    missing = [t for t in names if t not in table]
    if missing:
        sys.exit(f"no shard-end rule for target(s) {', '.join(missing)}: add one to {__file__}")

    rows = []
    if args.version:
        ref, sizes, starts = version_shards(args.version, args.catalog, args.split, with_starts=True)
        for t in names:
            rows.append({"target": t, "rule": table[t].text, "version": ref, **split_loss(table[t], sizes, starts)})
    else:
        work = (args.workdir or Path(tempfile.mkdtemp(prefix="shardflow-shard-loss-"))).resolve()
        work.mkdir(parents=True, exist_ok=True)
        for t in names:
            print(f"building {args.corpus} for --target {t} ...", flush=True)
            ref, catalog = build_for(t, args.corpus, work, args.val_fraction)
            ref, sizes, starts = version_shards(ref, catalog, args.split, with_starts=table[t].needs_starts)
            rows.append({"target": t, "rule": table[t].text, "version": ref, **split_loss(table[t], sizes, starts)})
            if not args.keep:
                shutil.rmtree(work / t, ignore_errors=True)

    print(f"\ntokens each target's reader drops at shard ends, split {args.split!r}:\n")
    print("| target | reader's rule | shards | shard tokens (min / median / max) | tokens | lost at shard ends | % "
          "| as one file |")
    print("|---|---|---:|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['target']} | {r['rule']} | {r['shards']} | {r['shard_tokens_min']:,} / "
              f"{r['shard_tokens_median']:,.0f} / {r['shard_tokens_max']:,} | {r['tokens']:,} | {r['lost']:,} | "
              f"{r['percent']:.3f} | {r['lost_as_one_file']:,} |")
    worst = max(rows, key=lambda r: r["percent"])
    print(f"\nworst: {worst['target']} loses {worst['percent']:.3f}% "
          f"({'within' if worst['percent'] <= 1 else 'OVER'} the 1% bound)")
    print(json.dumps({"split": args.split, "defaults": dataclasses.asdict(defaults), "rows": rows}))


if __name__ == "__main__":
    main()
