"""A version's parent is fixed when its build is planned, not taken from the catalog when it is published.

Before the build package was split into stages, ``publish_out`` recorded the
catalog's latest version *at publish time* as the parent. A build that reused
the tokens of v1 but published after another build had published v2 claimed
v2 as its parent, although not one of its tokens came from v2.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from support.paths import SAMPLE

from shardflow.pipeline import build, make_layout, plan_build, tokenize_unit
from shardflow.catalog import Catalog
from shardflow.config import BuildConfig


def _split(src: Path, parts: int) -> None:
    table = pq.read_table(SAMPLE)
    n = table.num_rows // 3
    for i in range(parts):
        pq.write_table(table.slice(i * n, n if i < 2 else None), src / f"p{i}.parquet")


@pytest.mark.slow
def test_the_parent_is_the_version_the_reused_tokens_come_from(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    _split(src, 2)
    root, cat = tmp_path / "data", tmp_path / "catalog"
    config = BuildConfig(name="par", sources=(str(src),), shard_tokens=10_000)
    assert build(config, data_root=root, catalog=cat).ref == "par@v1"

    # A third file arrives; the nightly build plans against v1 and reuses its two files ...
    _split(src, 3)
    plan = plan_build(config, data_root=root, catalog=cat)
    assert plan.reuse is not None and plan.reuse.parent == "par@v1" and sorted(plan.reuse.inputs) == [0, 1]
    assert plan.parent == "par@v1"
    for u in range(len(plan.units)):
        tokenize_unit(plan, u)
    make_layout(plan)

    # ... while another build of the same dataset (other options) publishes v2 first.
    other = build(config.replace(shard_tokens=7_000), data_root=root, catalog=cat, reuse=False)
    assert other.ref == "par@v2"

    # The interrupted nightly build resumes and publishes v3: its parent is still v1.
    result = build(config, data_root=root, catalog=cat)
    assert result.ref == "par@v3"
    manifest = yaml.safe_load(Path(result.manifest_path).read_text())
    assert manifest["reuse"]["parent"] == "par@v1"
    assert manifest["parent"] == "par@v1"
    entry = next(v for v in Catalog(cat).versions("par") if v.version == "v3")
    assert entry.parent == "par@v1"


@pytest.mark.slow
def test_a_build_that_reuses_nothing_has_the_latest_version_at_planning_as_parent(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    _split(src, 2)
    root, cat = tmp_path / "data", tmp_path / "catalog"
    config = BuildConfig(name="par", sources=(str(src),), shard_tokens=10_000)
    build(config, data_root=root, catalog=cat)
    changed = config.replace(shard_tokens=5_000)  # other options: nothing can be reused
    plan = plan_build(changed, data_root=root, catalog=cat)
    assert plan.reuse is None and plan.parent == "par@v1"
    result = build(changed, data_root=root, catalog=cat)
    assert yaml.safe_load(Path(result.manifest_path).read_text())["parent"] == "par@v1"
