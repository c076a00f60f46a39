"""The order of the test files: the longest first, so that xdist's two workers finish together."""

from __future__ import annotations

import pytest

# The longest test files first. The suite is CPU-bound on 2 cores and xdist hands out whole files
# (``--dist loadfile``, with ``--no-loadscope-reorder`` in pyproject.toml; conftest's hook sorts): started in collection
# order, a 60-200 s file that comes last runs alone while the other worker idles. Serial wall
# seconds per file, measured with ``python -m pytest -q -n 0 --durations=0``; a stale list only
# costs balance, never coverage (every other file follows, in collection order).
LONGEST_FIRST = (
    "tests/test_docs.py",  # 207 s
    "tests/flows/test_bucket_no_shared_fs.py",  # 100 (an isolated cluster, seven builds on it)
    "tests/flows/test_dask_cluster.py",  # 67
    "tests/test_object_storage.py",  # 66
    "tests/test_embeddings.py",  # 66
    "tests/test_bucket_build.py",  # 61
    "tests/test_bucket_lifecycle.py",  # 58
    "tests/flows/test_deploy.py",  # 21 serial, 57 beside another worker (it waits on a process worker's polls)
    "tests/test_tokenizer_families.py",  # 44
    "tests/reliability/test_hostile_runtime.py",  # 40
    "tests/flows/test_bucket_build_cluster.py",  # 35
    "tests/flows/test_ops_dask.py",  # 20 serial, 34 beside another worker
    "tests/reliability/test_hostile_memory.py",  # 29
    "tests/targets/test_targets.py",  # 29
    "tests/test_model_tokenizers_e2e.py",  # 27
    "tests/test_push.py",  # 27
    "tests/pipeline/test_embed_parallel.py",  # 23
    "tests/flows/test_build_flow.py",  # 23
    "tests/test_cli.py",  # 22
    "tests/test_show_scale.py",  # 17
)

COLLECTED = pytest.StashKey[set]()
"""The files the session collected tests from, before any -k/-m deselection (conftest records them;
``test_collection.py`` reads them)."""
