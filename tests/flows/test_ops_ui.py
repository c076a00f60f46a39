"""The Prefect UI, checked in a real browser: a build run against ``prefect server start`` shows its
three artifacts, the summary first, the summary (totals, where to read the version, its shards) and
the dataset card's plots.

Headless Chromium (Debian's ``chromium``) is driven over the DevTools protocol
(``support/browser.py``): it opens the flow run's page, waits for the app to render,
clicks the Artifacts tab and then each artifact, and reads the rendered text; the
React UI (``/v2``) lists the run's artifacts in the same order.
Screenshots go to the test's tmp directory, or to ``docs/`` with
``SHARDFLOW_UPDATE_SCREENSHOTS=1`` (how ``docs/ui-*.png`` are made).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shardflow.manifest import read_manifest

from support.browser import Browser, find_chromium
from support.cli import run_cli
from support.paths import REPO
from support.prefect import PrefectServer

pytestmark = pytest.mark.skipif(
    find_chromium() is None,
    reason="the UI test needs a real browser: Chromium is not installed (apt-get install -y chromium)",
)


@pytest.mark.slow
def test_the_flow_run_page_shows_its_summary_first_then_the_card(
    prefect_server: PrefectServer, corpus: Path, tmp_path: Path
) -> None:
    name = "ui-demo"
    env = {**prefect_server.env, "CI": "true"}
    res = run_cli(
        ["build", str(corpus), "--name", name, "--shard-tokens", "200000", "--val-fraction", "0.1",
         "--data-root", "data", "--catalog", "cat"],
        env, tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    manifest_path = Path(res.stdout.strip().splitlines()[-1])
    m = read_manifest(manifest_path.parent)
    ref = m.ref
    (run,) = prefect_server.flow_runs(f"build {name}")
    shards = [s for e in m.splits.values() for s in e.shards]
    assert len(shards) >= 3

    update = os.environ.get("SHARDFLOW_UPDATE_SCREENSHOTS") == "1"
    shots = REPO / "docs" if update else tmp_path
    with Browser(width=1400, height=1100) as b:
        b.open(f"{prefect_server.url}/runs/flow-run/{run['id']}")
        # The run's header (name, state, dataset tag) and, in the default Logs tab, the core's log lines.
        text = b.wait_for_text(f"build {name}", "Completed", f"dataset:{name}", "shardflow.pipeline", timeout=60)
        assert "Can't connect to Server API" not in text

        b.click_text("Artifacts")
        keys = [f"{name}-{kind}" for kind in ("summary", "card", "progress")]
        page = b.wait_for_text(*keys, f"{ref}: {len(shards)} shards")  # the summary card's description
        # The run's artifacts as the page lists them: the summary first (the UI sorts by id: flows/report.py).
        assert _first_key(page, keys) == f"{name}-summary", page[:3000]
        assert f"{name}-shards" not in page and f"{name}-lengths" not in page  # three artifacts, no more
        b.screenshot(shots / "ui-flow-run.png")

        # The summary, rendered: totals, throughput, where to read it, its shards with their checksums.
        b.click_text(f"{name}-summary")
        summary = b.wait_for_text(
            f"Build summary: {name}", ref, str(manifest_path), "Validation", "passed", "cl100k_base",
            m.dtype, m.format_name, "Totals", f"{m.totals['tokens']:,}", "Throughput", "tokens/s",
            "Read it", f"shardflow validate {ref} --catalog", "Shards", *(s.file for s in shards),
        )
        assert "<|endoftext|>" in summary  # the escaped table cell renders as the token
        assert "file://" not in summary
        for s in shards:
            assert s.sha256 in summary, s.file
        b.screenshot(shots / "ui-summary.png")

        # The whole card as markdown, its plots inlined: the markdown renderer draws them.
        b.evaluate("history.back()")
        b.click_text("Artifacts")
        b.click_text(f"{name}-card")
        b.wait_for_text("Dataset card:", "Document lengths", "Tokens by input", "Shards", "Vocabulary")
        size = _drawn_image(b)
        assert size[0] > 200 and size[1] > 100, size
        assert "base64" not in b.text()  # the pictures, not their URLs
        b.screenshot(shots / "ui-card.png")

        # The React UI (its tab chosen in the URL: a click does not switch its tabs) lists them in the same order.
        b.open(f"{prefect_server.url}/v2/runs/flow-run/{run['id']}?tab=Artifacts")
        page = b.wait_for_text(f"build {name}", *keys, timeout=60)
        assert _first_key(page, keys) == f"{name}-summary", page[:3000]
    for png in ("ui-flow-run.png", "ui-summary.png", "ui-card.png"):
        assert (shots / png).stat().st_size > 10_000


def _first_key(text: str, keys: list[str]) -> str:
    """Of ``keys``, the one the page's text shows first."""
    return min(keys, key=lambda k: text.index(k))


def _drawn_image(b: Browser, timeout: float = 30) -> tuple[int, int]:
    """The natural size of the first decoded ``data:image/png`` image on the page (waits for one)."""
    import time

    script = (
        "(() => { const img = [...document.images].find(i => i.src.startsWith('data:image/png') && i.complete"
        " && i.naturalWidth > 0); return img ? [img.naturalWidth, img.naturalHeight, img.width, img.height] : null; })()"
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = b.evaluate(script)
        if found and found[2] > 0 and found[3] > 0:  # decoded, and laid out at a non-zero size
            return int(found[0]), int(found[1])
        time.sleep(0.25)
    raise AssertionError(f"no rendered PNG image on the page; it shows:\n{b.text()[:3000]}")
