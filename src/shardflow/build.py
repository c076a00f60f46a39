"""Deprecated: ``shardflow.build`` is ``shardflow.pipeline`` (the build's stages, driver and executors)."""

import warnings

from .pipeline import *  # noqa: F401,F403
from .pipeline import __all__  # noqa: F401

warnings.warn("shardflow.build is deprecated: import from shardflow.pipeline (e.g. from shardflow.pipeline import build)",
              DeprecationWarning, stacklevel=2)
