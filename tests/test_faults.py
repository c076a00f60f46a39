"""The fault injector (``shardflow.faults``) the reliability tests rely on: specs parse, count and act as documented.

The reliability tests that kill builds or fill disks are in the slow tier;
these keep the injector itself checked in the fast one (a typo in a spec must
never silently test nothing), with one real build that a fault stops.
"""

from __future__ import annotations

import errno

import pytest

from support.corpus import TINY_TEXTS, write_parquet
from shardflow import faults
from shardflow.config import BuildConfig
from shardflow.errors import ConfigError


@pytest.fixture
def fault_env(monkeypatch):
    """Set ``SHARDFLOW_FAULT`` for this test, with the hit counts reset before and after."""
    faults.reset()

    def set_spec(spec: str) -> None:
        monkeypatch.setenv(faults.ENV, spec)

    yield set_spec
    faults.reset()


def test_without_the_variable_no_point_acts_or_counts(monkeypatch):
    monkeypatch.delenv(faults.ENV, raising=False)
    faults.reset()
    faults.fault("layout")
    assert faults.hits("layout") == 0


@pytest.mark.parametrize("spec", ["shard-midd", "enospc:", "boom:layout", "eio:layout:x", "layout,enospc:nowhere"])
def test_a_misspelt_spec_is_one_config_error_naming_the_variable_and_the_choices(fault_env, spec):
    fault_env(spec)
    with pytest.raises(ConfigError, match=rf"^{faults.ENV}=.*is not \[ACTION:\]POINT\[:N\] with ACTION one of kill, enospc, eio, sleep, wait and POINT one of plan, "):
        faults.fault("layout")


def test_enospc_from_the_nth_hit_on_and_eio_only_once(fault_env):
    fault_env("enospc:shard-mid:2,eio:validate:1")
    faults.fault("shard-mid", "a.bin")  # 1st hit: before N
    for _ in range(2):  # a full disk stays full
        with pytest.raises(OSError) as full:
            faults.fault("shard-mid", "a.bin")
        assert full.value.errno == errno.ENOSPC and full.value.filename == "a.bin"
    assert faults.hits("shard-mid") == 3
    with pytest.raises(OSError, match=r"injected at validate") as transient:
        faults.fault("validate")
    assert transient.value.errno == errno.EIO
    faults.fault("validate")  # transient: the 2nd hit passes
    faults.fault("layout")  # a point no spec names neither acts nor counts
    assert (faults.hits("validate"), faults.hits("layout")) == (2, 0)


def test_wait_without_a_release_file_says_which_variable_to_set(fault_env, monkeypatch):
    monkeypatch.delenv(faults.RELEASE_ENV, raising=False)
    fault_env("wait:plan")
    with pytest.raises(ConfigError, match=rf"'wait:plan' needs {faults.RELEASE_ENV}=PATH"):
        faults.fault("plan")


def test_wait_blocks_until_released_and_marks_that_it_was_reached(fault_env, monkeypatch, tmp_path):
    release = tmp_path / "go"
    release.touch()  # already released: the wait returns at once
    monkeypatch.setenv(faults.RELEASE_ENV, str(release))
    fault_env("wait:plan")
    faults.fault("plan")
    assert [p.name.split("-")[0] for p in tmp_path.glob("go.reached-*")] == ["go.reached"]


def test_a_full_disk_at_the_layout_stops_a_real_build_before_anything_is_published(fault_env, small_vocab, tmp_path):
    from shardflow.pipeline import build

    source = write_parquet(tmp_path / "tiny.parquet", TINY_TEXTS)
    fault_env("enospc:layout")
    config = BuildConfig(name="tiny", sources=(str(source),), tokenizer=str(small_vocab))
    with pytest.raises(OSError) as full:
        build(config, data_root=tmp_path / "data", catalog=tmp_path / "catalog")
    assert full.value.errno == errno.ENOSPC
    assert faults.hits("layout") == 1
    assert not (tmp_path / "catalog" / "tiny.yaml").exists()
    assert not (tmp_path / "data" / "tiny" / "v1").exists()
