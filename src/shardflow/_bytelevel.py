"""GPT-2's byte-to-character table, in which byte-level BPE vocabularies (``tokenizer.json``) spell their tokens.

A leaf module (standard library only), so that both the tokenizer families and the
targets' ``hf_tokenizer/`` writer use one table without importing each other.
"""

from __future__ import annotations

import functools

__all__ = ["bytes_to_unicode"]


@functools.lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """Each byte's printable character: printable Latin-1 bytes stand for themselves, the rest from U+0100 on."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(printable, map(chr, chars)))
