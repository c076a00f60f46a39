"""shardflow: Parquet/Arrow text corpora to tokenized, validated, versioned shard datasets.

The core library (this package) never imports Prefect: sources, tokenizers,
shard formats, manifest, catalog, validation and the readers are plain Python
that training jobs and any orchestrator can use. The Prefect flow lives in the
top-level ``flows`` package.

The names below are imported on first use (PEP 562), so that importing one
light module (``shardflow.errors``) does not import numpy and pyarrow first:
the command line starts Prefect's temporary server before those imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["__version__", "BuildConfig", "ShardflowError", "open_version", "Version", "Split"]

_LAZY = {
    "BuildConfig": ".config",
    "ShardflowError": ".errors",
    "open_version": ".reader",
    "Version": ".reader",
    "Split": ".reader",
}

if TYPE_CHECKING:
    from .config import BuildConfig
    from .errors import ShardflowError
    from .reader import Split, Version, open_version


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value  # once: later lookups do not come here
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
