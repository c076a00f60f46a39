"""The exceptions shardflow raises for problems a user can fix.

Every ``ShardflowError`` carries one complete message: what is wrong, which file
(and row, where known), and how to fix it. The command line prints that message
and exits non-zero without a traceback; anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

__all__ = [
    "ShardflowError",
    "ConfigError",
    "InputError",
    "ValidationError",
    "ManifestError",
    "CatalogError",
]


class ShardflowError(Exception):
    """A problem the user can fix; the message says how."""


class ConfigError(ShardflowError, ValueError):
    """An invalid option or combination of options."""


class InputError(ShardflowError):
    """Bad input data: a missing column, a corrupt file, an empty corpus.

    Deterministic: retrying does not help, so orchestration never retries it.
    """


class ValidationError(ShardflowError):
    """Written or published data does not match its manifest or format."""


class ManifestError(ShardflowError):
    """A ``metadata.yaml`` that cannot be read with this version of shardflow."""


class CatalogError(ShardflowError):
    """A reference that does not resolve, or a catalog that cannot be updated."""
