"""``shardflow serve`` (flows/served.py): the flow object is registered with Prefect's runner, so each
served run is a multiprocessing child, forked from a process that has the build flow imported."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ops_support import SAMPLE

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str) -> str:
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout.strip()


@pytest.mark.slow
def test_served_runs_fork_from_a_process_with_the_flow_preloaded() -> None:
    out = _python("""
        import multiprocessing
        import prefect.flow_engine as engine
        from shardflow.flows import served
        assert served.use_forkserver(start=False)
        ctx = engine.multiprocessing.get_context("spawn")
        assert ctx.get_start_method() == "forkserver", ctx
        assert engine.multiprocessing.get_context("fork").get_start_method() == "fork"  # only spawn is replaced
        assert engine.multiprocessing.Process is multiprocessing.Process  # the rest is multiprocessing's
        from multiprocessing import forkserver
        assert forkserver._forkserver._preload_modules == served.PRELOAD
        assert served.use_forkserver(start=False)  # once is enough: applying it again changes nothing
        print("ok")
    """)
    assert out == "ok"


@pytest.mark.slow
def test_a_changed_prefect_keeps_its_own_spawn() -> None:
    """Only where Prefect's function still asks for spawn in the one place replaced."""
    out = _python("""
        import inspect, multiprocessing
        import prefect.flow_engine as engine
        from shardflow.flows import served
        real = inspect.getsource
        inspect.getsource = lambda obj: "def run_flow_in_subprocess(): ctx = multiprocessing.get_context('fork')"
        assert not served.use_forkserver(start=False)
        assert engine.multiprocessing is multiprocessing
        print("ok")
    """)
    assert out == "ok"


@pytest.mark.slow
def test_the_flow_still_validates_its_parameters_after_a_cloudpickle_round_trip(tmp_path: Path) -> None:
    """A registered flow reaches its run's process pickled by value (cloudpickle): its parameter
    annotations must be objects, not strings only resolvable in flows/build.py's namespace."""
    out = _python(f"""
        import cloudpickle
        from shardflow.flows.build import build_dataset
        from shardflow.config import BuildConfig
        flow = cloudpickle.loads(cloudpickle.dumps(build_dataset))
        params = flow.validate_parameters({{"config": BuildConfig(name="x", sources=({str(SAMPLE)!r},)), "workers": 2,
                                            "data_root": {str(tmp_path)!r}}})
        assert isinstance(params["config"], BuildConfig) and params["workers"] == 2
        print("ok")
    """)
    assert out == "ok"
