"""Where things are: the repository, the test assets, the shared corpora beside the checkout; the interpreter."""

from __future__ import annotations

import sys
from pathlib import Path

import shardflow

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
ASSETS = TESTS / "assets"
SAMPLE = ASSETS / "sample.parquet"
"""61 real documents, 4 row groups."""
SHARED = REPO.parent / "shared"
CORPORA = SHARED / "corpora"
MAKE_CORPUS = SHARED / "tools" / "make_corpus.py"
SRC_DIR = Path(shardflow.__file__).resolve().parent
PYTHON = sys.executable
SHARDFLOW = [PYTHON, "-m", "shardflow"]
