"""The ``build_dataset`` Prefect flow on Prefect's temporary test server: the bytes of a ``--no-prefect`` build.

The flow's other tests (a real server, Dask, the UI, the command line) are in
the slow tier; this keeps ``shardflow.flows.build`` and its task tags in the
fast one: the smallest real corpus, two work units, one flow run. It takes
about 15-20 s, nearly all of it starting Prefect's temporary server (once per
session), and is deliberately not marked slow: without it the fast tier would
not run the flow module at all (flows/build.py 22%).
"""

from __future__ import annotations

from pathlib import Path

from core_support import TINY_TEXTS, files_of, write_parquet


def test_the_flow_publishes_the_bytes_of_a_build_without_prefect(prefect_harness, small_vocab, tmp_path, monkeypatch):
    from shardflow.build import build
    from shardflow.config import BuildConfig
    from shardflow.flows.build import build_dataset

    monkeypatch.setenv("PREFECT_LOGGING_EXTRA_LOGGERS", "shardflow")
    sources = tuple(str(write_parquet(tmp_path / f"part{i}.parquet", TINY_TEXTS[i:] + TINY_TEXTS[:i])) for i in range(2))
    config = BuildConfig(name="tinyflow", sources=sources, tokenizer=str(small_vocab), boundary="eos")
    plain = build(config, data_root=tmp_path / "plain" / "data", catalog=tmp_path / "plain" / "cat")
    ref = build_dataset(config=config, workers=2, data_root=str(tmp_path / "flow" / "data"), catalog=str(tmp_path / "flow" / "cat"))
    assert ref == "tinyflow@v1"
    assert files_of(tmp_path / "flow" / "data" / "tinyflow" / "v1") == files_of(Path(plain.manifest_path).parent)
    # Built again, the flow finds the identical version and publishes nothing.
    assert build_dataset(config=config, workers=2, data_root=str(tmp_path / "flow" / "data"), catalog=str(tmp_path / "flow" / "cat")) == ref
    assert sorted(p.name for p in (tmp_path / "flow" / "data" / "tinyflow").iterdir() if p.name.startswith("v")) == ["v1"]
