"""A wildcard receive's sender, handed to the user as an int that remembers where it
came from.

``dist.recv(t, src=None)`` returns the rank that sent the message.  A program that picks
its next peer from that rank (``dst=src`` to reply, ``src=3 - first`` for the other
worker) follows whichever sender came first, so a different arrival order cannot
deadlock it; a program that names its next peer regardless of it can.  The traces of
the two look alike: the recorder tells them apart by handing out the sender as a
:class:`SourceRank`, an ``int`` subclass that carries the receive's op id through the
integer arithmetic that derives a peer from it (``+ - * // %``, and their mirrors), and
by writing that id (``via``) in the record of a send or receive whose peer is one.

On a subgroup torch translates the sender to a global rank (``get_global_rank``) and a
peer named from it back to a group rank (``get_group_rank``): :mod:`dl2.record.install`
wraps both to keep the mark.

A ``SourceRank`` is equal to, hashes as, prints as and pickles as the plain int (an
unpickled or JSON-written copy is a plain int): only ``type(x) is int`` sees it.
"""

from __future__ import annotations

from typing import Any


class SourceRank(int):
    """The global rank a wildcard receive matched; ``_dl2_via``: that receive's op id."""

    _dl2_via: int

    def __new__(cls, value: int, via: int) -> SourceRank:
        self = super().__new__(cls, value)
        self._dl2_via = via
        return self

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return int, (int(self),)

    def __repr__(self) -> str:
        return int.__repr__(int(self))

    __str__ = __repr__


def _derived(name: str) -> Any:
    plain = getattr(int, name)

    def method(self: SourceRank, *other: Any) -> Any:
        value = plain(self, *other)
        if type(value) is int:
            return SourceRank(value, self._dl2_via)
        return value  # NotImplemented, a float, a tuple (divmod)

    method.__name__ = name
    return method


for _name in (
    "__add__",
    "__radd__",
    "__sub__",
    "__rsub__",
    "__mul__",
    "__rmul__",
    "__floordiv__",
    "__rfloordiv__",
    "__mod__",
    "__rmod__",
    "__neg__",
    "__pos__",
    "__abs__",
    "__xor__",
    "__rxor__",
):
    setattr(SourceRank, _name, _derived(_name))


def via_of(peer: Any) -> int | None:
    """The op id of the wildcard receive ``peer`` was derived from, or None."""
    return peer._dl2_via if type(peer) is SourceRank else None
