"""Hugging Face ``datasets`` saved with ``save_to_disk``: a directory whose ``state.json`` lists its files.

The listed files are Arrow IPC streams, read directly (no ``datasets`` import)
in the dataset's order, which is the order ``state.json`` gives; their names
are relative to the directory. A ``DatasetDict`` directory (one subdirectory
per split) is refused with the split directory to pass instead.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import InputError
from .arrow import ARROW_STREAM

__all__ = ["SavedDataset", "HF_SAVED_DATASET"]


class SavedDataset:
    """The ``DirectoryLayout`` of a ``save_to_disk`` directory."""

    def expand(self, path: Path, spec: str) -> list[tuple[Path, str, str]] | None:
        if (path / "dataset_dict.json").exists():
            splits = sorted(p.name for p in path.iterdir() if p.is_dir())
            raise InputError(
                f"{spec}: this is a DatasetDict with splits {', '.join(splits)}; pass one split's directory, "
                f"e.g. {path / (splits[0] if splits else 'train')}"
            )
        if not (path / "state.json").exists():
            return None
        state = json.loads((path / "state.json").read_text())
        files = [entry["filename"] for entry in state.get("_data_files", [])]
        if not files:
            raise InputError(f"{path}: state.json lists no data files; is this a complete save_to_disk directory?")
        # save_to_disk always writes the stream format, so the kind is known without reading the files.
        return [(path / name, name, ARROW_STREAM.name) for name in files]


HF_SAVED_DATASET = SavedDataset()
