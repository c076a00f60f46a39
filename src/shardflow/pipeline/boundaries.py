"""The boundary tokens of a build (placement, BOS, EOS), resolved once while planning; a stage hand-off of ``model.py``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..manifest import boundary_tokens

__all__ = ["Boundaries"]


@dataclass(frozen=True, kw_only=True)
class Boundaries:
    """The boundary tokens of a build, resolved once while planning: the placement, BOS and EOS.

    ``bos`` is set for placements ``bos`` and ``both``, ``eos`` for ``eos`` and
    ``both``; each is ``(text, id)``. The tokenize stage inserts exactly these.
    """

    placement: str
    """``bos``, ``eos`` or ``both``."""
    bos: tuple[str, int] | None = None
    eos: tuple[str, int] | None = None

    def __post_init__(self) -> None:
        if self.bos is not None:
            object.__setattr__(self, "bos", (str(self.bos[0]), int(self.bos[1])))
        if self.eos is not None:
            object.__setattr__(self, "eos", (str(self.eos[0]), int(self.eos[1])))
        wants = {"bos": (True, False), "eos": (False, True), "both": (True, True)}.get(self.placement)
        if wants is None or wants != (self.bos is not None, self.eos is not None):
            raise ValueError(f"boundaries: placement {self.placement!r} with bos={self.bos!r}, eos={self.eos!r}")

    @property
    def bos_id(self) -> int | None:
        return None if self.bos is None else self.bos[1]

    @property
    def eos_id(self) -> int | None:
        return None if self.eos is None else self.eos[1]

    @property
    def per_document(self) -> int:
        """Boundary tokens added to each document (1 or 2)."""
        return (self.bos is not None) + (self.eos is not None)

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(t[1] for t in (self.bos, self.eos) if t is not None)

    def manifest_section(self, default: tuple[str, int] | None) -> dict[str, Any]:
        """The manifest's ``boundary`` section.

        ``token``/``token_id`` are the BOS (placements ``bos``, ``both``) or the
        EOS (``eos``), as readers before ``both`` expect. One token at the
        tokenizer's classic boundary ``default`` (``<|endoftext|>``) gives exactly
        the section such builds always had; otherwise (or with no ``default``: a
        tokenizer whose files define no boundary) ``bos`` and ``eos``
        (``{token, id}``, absent when not placed) are added.
        """
        main = self.bos if self.bos is not None else self.eos
        assert main is not None
        section: dict[str, Any] = {"token": main[0], "token_id": main[1], "placement": self.placement}
        if self.placement != "both" and default is not None and main == tuple(default):
            return section
        for kind, tok in (("bos", self.bos), ("eos", self.eos)):
            if tok is not None:
                section[kind] = {"token": tok[0], "id": tok[1]}
        return section

    @classmethod
    def from_section(cls, section: dict[str, Any]) -> "Boundaries":
        """A manifest's ``boundary`` section (any age) as ``Boundaries``."""
        placement, bos, eos = boundary_tokens(section)
        return cls(placement=placement, bos=bos, eos=eos)

    def to_dict(self) -> dict[str, Any]:
        return {
            "placement": self.placement,
            "bos": None if self.bos is None else list(self.bos),
            "eos": None if self.eos is None else list(self.eos),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Boundaries":
        return cls(
            placement=d["placement"],
            bos=None if d.get("bos") is None else tuple(d["bos"]),  # type: ignore[arg-type]
            eos=None if d.get("eos") is None else tuple(d["eos"]),  # type: ignore[arg-type]
        )
