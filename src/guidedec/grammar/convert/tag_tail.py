"""What follows a structural-tag format while it is written as Lark (see :class:`Tail`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Tail:
    """What follows a format: the end of the grammar (``eof``), something the caller writes
    (``opaque``; ``first`` holds its possible first characters where known), or one of
    ``ends``, which the format itself must write after its content."""

    kind: str
    ends: tuple[str, ...] = ()
    first: str | None = None
    alone: bool = True  # at the start, no other parse is alive (free text needs this)

    def but(self, *, alone: bool) -> Tail:
        return Tail(self.kind, self.ends, self.first, self.alone and alone)

    def first_chars(self) -> str | None:
        """The characters that can come next, or None where unknown (eof: none can)."""
        if self.kind == "eof":
            return ""
        if self.kind == "ends":
            return None if "" in self.ends else "".join(e[0] for e in self.ends)
        return self.first


EOF = Tail("eof")
