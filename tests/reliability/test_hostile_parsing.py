"""Hostile files meet bounded parsing: alias bombs, repeated shards, nesting and size limits, malformed fields,
bad rank files, oversized JSON integers.

Every case is refused with one ``shardflow: error:`` line naming the file (and
the field or line), exit status 2, no traceback, and nothing published; the
alias bombs within a second and 50 MB, a manifest listing one shard 100,000
times within 2 s and 200 MB (measured in a subprocess).
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from support.cli import CliRun, cli_env, run_cli, run_main
from support.corpus import small_vocab
from support.paths import SAMPLE
from shardflow.catalog import Catalog
from shardflow.errors import CatalogError, ConfigError, ManifestError
from shardflow.manifest import read_manifest
from shardflow.tokenizers import load_tokenizer

NAME = "hostile"


def version_dir(root: Path) -> Path:
    return root / "data" / NAME / "v1"


def assert_one_error(rc: int, err: str, *patterns: str) -> None:
    assert rc == 2, err
    assert "Traceback" not in err, err
    assert err.count("shardflow: error:") == 1, err
    line = err.strip()
    assert "\n" not in line, err
    for pattern in patterns:
        assert re.search(pattern, line), f"{pattern!r} not in {line!r}"


# --- alias bombs ------------------------------------------------------------------------------------------

def laughs(indent: str) -> str:
    """Billion laughs, ~600 bytes: nine levels of nine aliases, 9^9 ``lol`` when expanded."""
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 10)]
    return "".join(f"{indent}{line}\n" for line in lines)


def bomb_manifest(directory: Path, field: str) -> Path:
    """The bomb as the manifest's ``description`` (a mapping) or inside its ``config``."""
    path = directory / "metadata.yaml"
    text = path.read_text()
    if field == "description":
        text = text.replace("description: ''\n", "description:\n" + laughs("  "), 1)
    else:
        text = text.replace("config:\n", "config:\n  bomb:\n" + laughs("    "), 1)
    assert "*l8" in text
    path.write_text(text)
    return path


def bomb_catalog(root: Path) -> Path:
    path = root / "catalog" / f"{NAME}.yaml"
    text = path.read_text().replace("  created_at:", "  bomb:\n" + laughs("    ") + "  created_at:", 1)
    assert "*l8" in text
    path.write_text(text)
    return path


# Runs in a fresh interpreter: each step's time, and the peak RSS over the baseline after imports.
_MEASURE = textwrap.dedent(
    """
    import contextlib, io, json, resource, sys, time
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # today's code would take the machine
    from shardflow.cli.commands import main
    from shardflow.reader import open_version
    import shardflow.validation, shardflow.diff
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = []
    for step in json.loads(sys.argv[1]):
        err = io.StringIO()
        start = time.perf_counter()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            if step[0] == "open":
                try:
                    open_version(step[1], catalog=step[2])
                    rc = 0
                except Exception as exc:
                    rc, err = 2, io.StringIO(f"shardflow: error: {exc}")
            else:
                rc = main(step)
        out.append({"step": step, "rc": rc, "err": err.getvalue(), "seconds": time.perf_counter() - start})
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
    print(json.dumps({"steps": out, "grown_kib": grown}))
    """
)


def measure(steps: list[list[str]]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURE, json.dumps(steps)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_bombs_refused(result: dict[str, Any], bomb: Path) -> None:
    for step in result["steps"]:
        assert_one_error(step["rc"], step["err"], re.escape(str(bomb)), r"alias bomb")
        assert step["seconds"] < 1.0, step
    assert result["grown_kib"] < 50 * 1024, result


@pytest.mark.parametrize("field", ["description", "config"])
def test_an_alias_bomb_in_a_manifest_is_refused_quickly_in_bounded_memory(root, field):
    # A copy the catalog does not list, so no published checksum stops the reader before the bomb does.
    loose = root / "loose"
    shutil.copytree(version_dir(root), loose)
    bomb = bomb_manifest(loose, field)
    directory, catalog = str(loose), str(root / "catalog")
    assert bomb.stat().st_size < 10_000
    result = measure([
        ["show", directory, "--catalog", catalog],
        ["validate", directory, "--catalog", catalog],
        ["diff", directory, directory, "--catalog", catalog],
        ["ls", NAME, "--catalog", catalog],
        ["open", directory, catalog],
    ])
    ls = result["steps"].pop(3)  # ls reads the catalog, not the manifest: it works, and stays small
    assert ls["rc"] == 0 and ls["seconds"] < 1.0, ls
    assert_bombs_refused(result, bomb)


def test_an_alias_bomb_in_a_catalog_file_is_refused_quickly_in_bounded_memory(root):
    bomb = bomb_catalog(root)
    catalog = str(root / "catalog")
    ref = f"{NAME}@v1"
    result = measure([
        ["ls", "--catalog", catalog],
        ["ls", NAME, "--catalog", catalog],
        ["show", ref, "--catalog", catalog],
        ["validate", ref, "--catalog", catalog],
        ["diff", ref, ref, "--catalog", catalog],
        ["open", ref, catalog],
    ])
    assert_bombs_refused(result, bomb)


def test_aliases_that_safe_dump_writes_still_load(root):
    """yaml.safe_dump anchors an object it meets twice; a few such aliases are fine."""
    path = version_dir(root) / "metadata.yaml"
    data = yaml.safe_load(path.read_text())
    shared = {"note": "the same mapping twice"}
    data["config"]["a"], data["config"]["b"] = shared, shared
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert "&id001" in path.read_text()
    assert read_manifest(path).config["b"] == shared


def test_a_recursive_alias_is_refused(root):
    path = version_dir(root) / "metadata.yaml"
    path.write_text(path.read_text().replace("description: ''\n", "description: &r [1, *r]\n", 1))
    with pytest.raises(ManifestError, match=r"metadata\.yaml: refused: line \d+, column \d+: an alias refers to a collection that contains it"):
        read_manifest(path)


@pytest.mark.slow
def test_a_manifest_listing_one_shard_100000_times_is_refused_quickly_in_bounded_memory(root):
    """Written out in full (no aliases), 40 MB: refused at the second listing, before the rest is parsed."""
    loose = root / "loose"
    shutil.copytree(version_dir(root), loose)
    path = loose / "metadata.yaml"
    path.chmod(0o644)
    data = yaml.safe_load(path.read_text())
    first = data["splits"]["train"]["shards"][0]
    data["splits"]["train"]["shards"] = [first] * 100_000
    path.write_text(json.dumps(data, indent=1, default=str))  # JSON is YAML
    assert path.stat().st_size > 30_000_000
    directory, catalog = str(loose), str(root / "catalog")
    result = measure([
        ["validate", directory, "--catalog", catalog],
        ["show", directory, "--catalog", catalog],
        ["open", directory, catalog],
    ])
    for step in result["steps"]:
        assert_one_error(
            step["rc"], step["err"], re.escape(str(path)),
            rf"lists the shard {re.escape(first['file'])} more than once \(splits\.train\.shards\[0\]\.file and "
            r"splits\.train\.shards\[1\]\.file, line \d+\); a version lists each shard once",
        )
        assert step["seconds"] < 2.0, step
    assert result["grown_kib"] < 200 * 1024, result


def test_a_shard_listed_in_two_splits_is_refused(root):
    path = version_dir(root) / "metadata.yaml"
    path.chmod(0o644)
    data = yaml.safe_load(path.read_text())
    data["splits"]["val"]["shards"].append(data["splits"]["train"]["shards"][0])
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ManifestError, match=r"more than once \(splits\.train\.shards\[0\]\.file and "
                                            r"splits\.val\.shards\[\d+\]\.file\)"):
        read_manifest(path)


def test_nesting_too_deep_is_refused_before_it_is_composed(root):
    path = version_dir(root) / "metadata.yaml"
    path.chmod(0o644)
    path.write_text(path.read_text().replace("description: ''\n", "description: " + "[" * 300 + "]" * 300 + "\n", 1))
    with pytest.raises(ManifestError, match=r"metadata\.yaml: refused: line \d+, column \d+: nested more than 200 levels"):
        read_manifest(path)


def test_more_nodes_than_the_limit_are_refused_while_streaming(root, monkeypatch):
    """The cap on a document's nodes (8 million: ~400,000 shards), lowered so that the sample's manifest passes it."""
    import shardflow._yaml

    path = version_dir(root) / "metadata.yaml"
    assert read_manifest(path).name == NAME
    monkeypatch.setattr(shardflow._yaml, "MAX_NODES", 50)
    with pytest.raises(ManifestError, match=r"metadata\.yaml: refused: it has more than 50 YAML nodes"):
        read_manifest(path)


# --- malformed manifest and catalog fields -------------------------------------------------------------------

def _set(path: list[Any], value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(d: dict[str, Any]) -> None:
        for key in path[:-1]:
            d = d[key]
        d[path[-1]] = value
    return edit


MANIFEST_CASES = {
    "tokenized_info": (_set(["tokenized_info"], 5), r"field 'tokenized_info' must be a mapping, not 5"),
    "shard_int": (_set(["splits", "train", "shards", 0], 7), r"split 'train', shard 0: a shard must be a mapping .*not 7"),
    "bytes": (_set(["splits", "train", "shards", 0, "bytes"], "lots"), r"split 'train', shard 0: field 'bytes' must be a non-negative integer, not 'lots'"),
    "dtype": (_set(["tokenized_info", "dtype"], "float128"), r"tokenized_info: field 'dtype' must be uint16 or uint32, not 'float128'"),
    "nul": (_set(["splits", "train", "shards", 0, "file"], "train/a\0b.bin"), r"split 'train', shard 0: file name 'train/a\\x00b.bin' holds a control character"),
    "index_int": (_set(["splits", "train", "shards", 0, "index"], 3), r"shard 0: a file entry must be a mapping of file, bytes and sha256, not 3"),
    "shards": (_set(["splits", "train", "shards"], "many"), r"split 'train': field 'shards' must be a list of shards, not 'many'"),
    "vocab": (_set(["tokenized_info", "vocab_size"], -1), r"tokenized_info: field 'vocab_size' must be a non-negative integer, not -1"),
    "boundary": (_set(["boundary", "placement"], "middle"), r"boundary: field 'placement' must be bos, eos or both, not 'middle'"),
    "boundary_id": (_set(["boundary", "token_id"], [1]), r"boundary: not a boundary section"),
    "name": (_set(["name"], ["x"]), r"field 'name' must be a string, not \['x'\]"),
    "parents": (_set(["parent_datasets"], "x"), r"field 'parent_datasets' must be a list of strings"),
}


@pytest.mark.parametrize("case", sorted(MANIFEST_CASES))
@pytest.mark.parametrize("command", ["validate", "show"])
def test_a_malformed_manifest_field_is_one_message_naming_the_field(root, case, command):
    edit, pattern = MANIFEST_CASES[case]
    path = version_dir(root) / "metadata.yaml"
    data = yaml.safe_load(path.read_text())
    edit(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    rc, _, err = run_main(command, str(version_dir(root)), "--catalog", str(root / "catalog"))
    assert_one_error(rc, err, re.escape(str(path)), pattern)


def test_a_malformed_manifest_field_is_refused_by_diff_and_the_runtime(root):
    from shardflow.reader import open_version

    path = version_dir(root) / "metadata.yaml"
    data = yaml.safe_load(path.read_text())
    data["splits"]["train"]["shards"][0]["bytes"] = "lots"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    rc, _, err = run_main("diff", str(version_dir(root)), str(version_dir(root)), "--catalog", str(root / "catalog"))
    assert_one_error(rc, err, r"field 'bytes' must be a non-negative integer")
    with pytest.raises(ManifestError, match=r"field 'bytes' must be a non-negative integer, not 'lots'"):
        open_version(version_dir(root), catalog=root / "catalog")


CATALOG_CASES = {
    "versions": (lambda d: d.update(versions=5), r"field 'versions' must be a list of versions, not 5"),
    "build_key": (lambda d: d["versions"][0].pop("build_key"), r"versions\[0\]: missing field 'build_key'"),
    "entry": (lambda d: d["versions"].append("v2"), r"versions\[1\]: an entry must be a mapping, not 'v2'"),
    "path": (lambda d: d["versions"][0].update(path=None), r"versions\[0\]: field 'path' must be a string, not None"),
    "latest": (lambda d: d.update(latest=[1]), r"field 'latest' must be a string or null, not \[1\]"),
}


@pytest.mark.parametrize("case", sorted(CATALOG_CASES))
@pytest.mark.parametrize("command", [["ls"], ["ls", NAME], ["show", f"{NAME}@v1"], ["validate", f"{NAME}@v1"]])
def test_a_malformed_catalog_is_one_message_naming_the_field(root, case, command):
    edit, pattern = CATALOG_CASES[case]
    path = root / "catalog" / f"{NAME}.yaml"
    data = yaml.safe_load(path.read_text())
    edit(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    rc, _, err = run_main(*command, "--catalog", str(root / "catalog"))
    assert_one_error(rc, err, re.escape(str(path)), pattern)
    with pytest.raises(CatalogError, match=pattern):
        Catalog(root / "catalog").versions(NAME)


# --- .tiktoken rank files ----------------------------------------------------------------------------------

def _rank_lines(tmp_path: Path) -> list[bytes]:
    return small_vocab(tmp_path / "vocab").read_bytes().splitlines()[:300]


def _extra(token: bytes, rank: str) -> bytes:
    return base64.b64encode(token) + b" " + rank.encode()


RANK_CASES = {
    "duplicate_rank": (lambda ls: ls + [_extra(b"zqzq", "7")], r"line 301: rank 7 is already the rank of line 8"),
    "duplicate_bytes": (lambda ls: ls + [ls[4].split()[0] + b" 300"], r"line 301: token b'%' is already ranked on line 5"),
    "huge_rank": (lambda ls: ls + [_extra(b"zqzq", str(2**40))], r"line 301: rank '1099511627776' is not an integer from 0 to"),
    "negative_rank": (lambda ls: ls + [_extra(b"zqzq", "-5")], r"line 301: rank '-5' is not an integer from 0 to"),
    "empty": (lambda ls: [], r"it holds no ranks"),
    "missing_byte": (lambda ls: ls[:97] + ls[98:], r"1 of the 256 single bytes have no rank, the first b'\\xa4'; byte-level BPE needs a rank for each"),
    "not_base64": (lambda ls: ls + [b"@@@@ 300"], r"line 301: b'@@@@' is not base64"),
}


@pytest.mark.parametrize("case", sorted(RANK_CASES))
@pytest.mark.parametrize("backend", ["auto", "tiktoken"])
def test_a_bad_rank_file_is_refused_naming_the_file_and_line(tmp_path, case, backend):
    make, pattern = RANK_CASES[case]
    lines = make(_rank_lines(tmp_path))
    path = tmp_path / f"{case}.tiktoken"
    path.write_bytes(b"\n".join(lines) + (b"\n" if lines else b""))
    with pytest.raises(ConfigError, match=rf"tokenizer rank file '{re.escape(str(path))}' is not a valid \.tiktoken file \({pattern}"):
        load_tokenizer(str(path), backend=backend)


def test_a_bad_rank_file_stops_a_build_before_anything_is_tokenized(tmp_path):
    path = tmp_path / "dup.tiktoken"
    path.write_bytes(b"\n".join(_rank_lines(tmp_path) + [_extra(b"zqzq", "7")]) + b"\n")
    rc, _, err = run_main("build", str(SAMPLE), "--name", "dup", "--tokenizer", str(path), "--no-prefect",
                          "--data-root", str(tmp_path / "data"), "--catalog", str(tmp_path / "catalog"), "--progress", "none")
    assert_one_error(rc, err, re.escape(str(path)), r"line 301: rank 7 is already the rank of line 8")
    assert not (tmp_path / "catalog" / "dup.yaml").exists()
    assert not list((tmp_path / "data").rglob("*.bin")) if (tmp_path / "data").exists() else True


def test_a_rank_colliding_with_a_known_encodings_special_token_is_refused(tmp_path):
    path = tmp_path / "r50k_base.tiktoken"
    path.write_bytes(b"\n".join(_rank_lines(tmp_path) + [_extra(b"zqzq", "50256")]) + b"\n")
    with pytest.raises(ConfigError, match=r"line 301: rank 50256 is the id of the special token <\|endoftext\|>"):
        load_tokenizer(str(path), backend="tiktoken")


# --- JSON integers past Python's limit ------------------------------------------------------------------------

@pytest.fixture
def big_int_jsonl(tmp_path) -> Path:
    path = tmp_path / "in" / "big.jsonl"
    path.parent.mkdir()
    records = [json.dumps({"text": "The first document."}),
               '{"text": "x", "n": ' + "7" * 5000 + "}",
               json.dumps({"text": "The third document."})]
    path.write_text("\n".join(records) + "\n")
    return path


def _build_jsonl(tmp_path: Path, source: Path, policy: str) -> CliRun:
    return run_main("build", str(source), "--name", "big", "--tokenizer", str(small_vocab(tmp_path / "vocab")),
                    "--no-prefect", "--on-bad-record", policy, "--data-root", str(tmp_path / "data"),
                    "--catalog", str(tmp_path / "catalog"), "--progress", "none")


def test_a_json_integer_over_4300_digits_fails_naming_the_line(tmp_path, big_int_jsonl):
    rc, _, err = _build_jsonl(tmp_path, big_int_jsonl, "fail")
    assert_one_error(rc, err, re.escape(str(big_int_jsonl)) + r" line 2: a JSON integer of more than 4,300 digits")
    assert not (tmp_path / "catalog" / "big.yaml").exists()


def test_a_json_integer_over_4300_digits_is_skipped_and_counted(tmp_path, big_int_jsonl):
    rc, _, err = _build_jsonl(tmp_path, big_int_jsonl, "skip")
    assert rc == 0, err
    totals = read_manifest(tmp_path / "data" / "big" / "v1").totals
    assert totals["bad_records"] == 1 and totals["documents"] == 2


# --- a tokenizer.json whose pattern makes the library panic -----------------------------------------------------------

def _split_tokenizer(path: Path, pattern: str) -> Path:
    """A 5 KB byte-level tokenizer.json (256 byte tokens, no merges, ``<|endoftext|>``) whose pre-tokenizer is a
    Split on ``pattern``, then ByteLevel. gigatoken refuses a Split regex it does not know, so it is the tokenizers
    library (Oniguruma) that runs the pattern, and panics when the engine gives up on it."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<|endoftext|>": 0, **{ch: i + 1 for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def test_a_tokenizer_file_that_makes_its_library_panic_is_one_line_naming_it(tmp_path):
    pytest.importorskip("tokenizers")
    corpus = tmp_path / "in" / "docs.jsonl"
    corpus.parent.mkdir()
    # A run of 'a's and one of 'ab's, as any corpus may hold: each makes one of the files' patterns give up.
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["plain text", "a" * 40 + "!", "ab" * 40 + "!"]))

    def build(tokenizer: Path, name: str) -> subprocess.CompletedProcess[str]:
        # RUST_BACKTRACE=1, as on the machine of the report: the library's panic came with 90 lines.
        return run_cli(["build", corpus, "--name", name, "--tokenizer", tokenizer, "--bos-token", "<|endoftext|>",
                        "--no-prefect", "--progress", "none", "--data-root", tmp_path / "data",
                        "--catalog", tmp_path / "catalog"], env=cli_env({"RUST_BACKTRACE": "1"}), timeout=60)

    # (a+)+$ backtracks catastrophically on a run of 'a's (25 of them make Oniguruma give up, and the library
    # panic: a PanicException, which no `except Exception` catches). Refused as the file is loaded, in one line.
    nested = _split_tokenizer(tmp_path / "nested" / "tokenizer.json", r"(a+)+$")
    res = build(nested, "nested")
    assert res.returncode == 2 and res.stdout == "", res.stderr
    assert res.stderr.count("\n") == 1, res.stderr  # no Python traceback, nor the library's backtrace
    assert res.stderr.startswith(f"shardflow: error: tokenizer {nested}: the tokenizer library panicked while encoding a "
                                 "run of 1024 'a' then '!' (Onig: Regex search error: retry-limit-in-match over); its "
                                 "pre-tokenizer's regular expression (a Split pattern) backtracks catastrophically")
    assert "the file is at fault, not the text" in res.stderr
    # ((ab)+)+$ passes those runs and panics on a document: the build stops there, in one line of shardflow's
    # after the library's own notice (printed before Python sees the panic), exit 2, nothing published.
    pairs = _split_tokenizer(tmp_path / "pairs" / "tokenizer.json", r"((ab)+)+$")
    res = build(pairs, "pairs")
    assert res.returncode == 2 and "Traceback" not in res.stderr and res.stderr.count("shardflow: error:") == 1, res.stderr
    assert res.stderr.splitlines()[-1].startswith(f"shardflow: error: tokenizer {pairs.resolve()}: the tokenizer "
                                                  "library panicked while encoding text (Onig: Regex search error")
    assert not (tmp_path / "catalog").exists() or not list((tmp_path / "catalog").glob("*.yaml"))
    # And in this process: a ConfigError (exit 2), from encoding and from the reference alike.
    tok = load_tokenizer(str(pairs))
    for call in (lambda: tok.encode_batch(["ab" * 40 + "!"]), lambda: tok.encode_ordinary("ab" * 40 + "!")):
        with pytest.raises(ConfigError, match=rf"^tokenizer {re.escape(str(pairs.resolve()))}: the tokenizer library panicked"):
            call()
    assert tok.decode(tok.encode_ordinary("plain text")) == "plain text"
