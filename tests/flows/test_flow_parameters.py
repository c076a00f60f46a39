"""The build flow's parameters reach the server as Prefect would send them, without FastAPI's import.

``flows.build.BuildFlow`` serializes the run's parameters with pydantic's
``to_jsonable_python`` instead of Prefect's FastAPI ``jsonable_encoder`` (an
import of 0.3 s before every flow run is created). These tests hold it to
Prefect's own output, for any build configuration, and check that a build
from the command line never imports FastAPI.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prefect import Flow

from shardflow.flows.build import BuildFlow, build_dataset
from shardflow.config import BuildConfig, EmbedOptions

from ops_support import SAMPLE, PrefectServer, run_cli

words = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)


@st.composite
def configs(draw: st.DrawFn) -> BuildConfig:
    """Build configurations over the options that change what is serialized (unset ones included)."""
    options: dict[str, object] = {}
    if draw(st.booleans()):
        options["target"] = draw(st.sampled_from(["megatron", "nemo", "olmo-core", "kempnerforge"]))
    else:
        if draw(st.booleans()):
            options["format"] = draw(st.sampled_from(["nanogpt", "npy", "bin"]))
        if draw(st.booleans()):
            options["boundary"] = draw(st.sampled_from(["bos", "eos", "both"]))
        if draw(st.booleans()):
            options["shard_tokens"] = draw(st.integers(1, 2**31 - 1))
    if draw(st.booleans()):
        options["val_fraction"] = draw(st.floats(0.0, 0.5))
    if draw(st.booleans()):
        options["embed"] = EmbedOptions(codec=draw(st.sampled_from(["int8", "float16", "e4m3-rowscale"])))
    return BuildConfig(
        name="d" + draw(st.text("abcxyz0123_-.", max_size=8)),
        sources=tuple(draw(st.lists(words.filter(bool), min_size=1, max_size=3))),
        text_column=draw(words.filter(bool)),
        id_column=draw(st.none() | words.filter(bool)),
        description=draw(words),
        seed=draw(st.integers(0, 2**32)),
        stats_column=draw(st.none() | words.filter(bool)),
        **options,  # type: ignore[arg-type]
    )


def _same_json(params: dict[str, object]) -> dict[str, object]:
    """``params`` as Prefect's own method serializes them, and as BuildFlow's, the set ``_unset`` in one order.

    ``BuildConfig._unset`` is a frozenset: Prefect's encoder lists a copy of it,
    whose order can differ from the original's (string hashes vary per process).
    """

    def norm(value: object) -> object:
        if isinstance(value, dict) and isinstance(value.get("_unset"), list):
            return {**value, "_unset": sorted(value["_unset"])}
        return value

    ours = {k: norm(v) for k, v in build_dataset.serialize_parameters(params).items()}
    prefects = {k: norm(v) for k, v in Flow.serialize_parameters(build_dataset, params).items()}
    assert ours == prefects
    return ours


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(config=configs(), workers=st.integers(1, 64), data_root=st.none() | words, runner=st.sampled_from(["threads", "dask"]))
def test_parameters_serialize_as_prefects_own(config: BuildConfig, workers: int, data_root: str | None, runner: str) -> None:
    params = dict(config=config, workers=workers, data_root=data_root, catalog=None, runner=runner, address=None)
    _same_json(params)


def test_any_other_value_goes_through_prefects_method() -> None:
    params = {"config": BuildConfig(name="d", sources=("x",)), "data_root": Path("/data")}
    assert isinstance(build_dataset, BuildFlow)
    assert _same_json(params)["data_root"] == "/data"
    # A value inside the config that pydantic cannot encode (seed is not type-checked): Prefect's placeholder.
    import numpy as np

    odd = {"config": BuildConfig(name="d", sources=("x",), seed=np.int64(3)), "workers": 2}
    assert build_dataset.serialize_parameters(odd) == Flow.serialize_parameters(build_dataset, odd)


@pytest.mark.slow
def test_the_server_records_prefects_serialization_and_the_command_line_never_imports_fastapi_or_pandas(
    prefect_server: PrefectServer, tmp_path: Path
) -> None:
    # -X importtime's lines name every module the process imported (on stderr).
    # No plot helper: its process would write its own import lines to the same stderr.
    env = {**prefect_server.env, "PYTHONPROFILEIMPORTTIME": "1", "SHARDFLOW_PLOT_HELPER": "0"}
    proc = run_cli(["build", str(SAMPLE), "--name", "params-sample", "--progress", "none"], env, tmp_path)
    told = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 0, "\n".join(told[-40:])
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "prefect.flow_engine" in imported and "pyarrow.compute" in imported  # the lines are there
    assert not {m for m in imported if m == "fastapi" or m.startswith("fastapi.")}
    assert "pandas" not in imported  # 0.5 s on the GIL that pyarrow's conversions of Python objects cost (shardflow._arrow)

    run = prefect_server.flow_runs("build params-sample")[0]
    config = BuildConfig(name="params-sample", sources=(str(SAMPLE),))
    # What the command line passes (its defaults), as Prefect's own method serializes it.
    sent = dict(config=config, workers=2, data_root=None, catalog=None, runner="threads", address=None)
    recorded = run["parameters"]
    recorded["config"]["_unset"] = sorted(recorded["config"]["_unset"])
    assert recorded == _same_json(sent)
