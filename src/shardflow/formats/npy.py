"""The ``npy`` shard format: one flat 1-D NumPy ``.npy`` array per shard (KempnerForge's layout).

Written as NPY format version 1.0 with descr ``'<u2'`` or ``'<u4'``,
``fortran_order: False`` and shape ``(N,)``. For any N below 2**31 the header
is exactly 128 bytes, so a writer can emit it before streaming the tokens.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .._io import NPY_LOCK
from ..errors import ValidationError
from .base import TOKEN_DTYPES, ShardFormat

__all__ = ["NpyFormat", "NPY"]


class NpyFormat(ShardFormat):
    name = "npy"
    extension = "npy"
    header_magic = None

    def header(self, ntokens: int, dtype: np.dtype) -> bytes:
        self.check_dtype(dtype)
        import io

        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            buf, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": (ntokens,)}
        )
        return buf.getvalue()

    def read_header(self, path: Path, dtype: np.dtype | None) -> tuple[int, int, np.dtype]:
        try:
            with open(path, "rb") as f:
                version = np.lib.format.read_magic(f)
                if version != (1, 0):
                    raise ValueError(f"npy version {version}, expected (1, 0)")
                with NPY_LOCK:  # the header is parsed with ast.literal_eval (see _io.NPY_LOCK)
                    shape, fortran, found = np.lib.format.read_array_header_1_0(f)
                offset = f.tell()
        except (ValueError, OSError, SyntaxError) as exc:
            raise ValidationError(f"{path}: not a valid .npy shard ({exc})") from None
        if len(shape) != 1 or fortran:
            raise ValidationError(f"{path}: an npy shard is a flat 1-D array, not shape {shape}")
        if found not in TOKEN_DTYPES.values():
            raise ValidationError(f"{path}: npy dtype {found} is not uint16 or uint32 (little-endian)")
        if dtype is not None and np.dtype(dtype) != found:
            raise ValidationError(f"{path}: npy header says {found} tokens but the manifest says {np.dtype(dtype)}")
        return offset, int(shape[0]), found


NPY = NpyFormat()
