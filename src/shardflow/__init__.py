"""shardflow: Parquet/Arrow text corpora to tokenized, validated, versioned shard datasets.

The core library (this package) never imports Prefect: sources, tokenizers,
shard formats, manifest, catalog, validation and the readers are plain Python
that training jobs and any orchestrator can use. The Prefect flow lives in the
top-level ``flows`` package.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .config import BuildConfig
from .errors import ShardflowError
from .reader import Split, Version, open_version

__all__ = ["__version__", "BuildConfig", "ShardflowError", "open_version", "Version", "Split"]
