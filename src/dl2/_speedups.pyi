"""Types of dl2._speedups (built from _speedups.c; see dl2.speedups)."""

from collections.abc import Callable
from types import FrameType
from typing import Any

def setup(
    kinds: dict[str, int],
    cache: dict[int, Any],
    ids: dict[tuple[str, ...], int],
    fallback: Callable[[FrameType | None], tuple[str | None, int]],
    user: int,
    third: int,
    api: int,
    max_frames: int,
    max_walk: int,
    /,
) -> None: ...
def capture(frame: FrameType | None, /) -> tuple[str | None, int]: ...

class EncoderCore:
    def op_hot(
        self,
        oid: int,
        t: int,
        tid: int,
        key: tuple[Any, ...],
        seq: int | None,
        is_async: bool,
        sid: int,
        /,
    ) -> bool: ...
