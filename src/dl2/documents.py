"""The JSON documents dl2 writes for itself (witnesses, replay plans): their common head.

Each carries ``"kind"`` (what it is) and ``"format"`` (its version); a reader checks both
before it reads anything else, so a foreign or newer file is one clear error.
"""

from __future__ import annotations

from typing import Any

from dl2.errors import ConfigError


def check_document(data: Any, kind: str, version: int, noun: str) -> dict[str, Any]:
    """``data`` as a document of ``kind`` in format ``version``.

    Raises:
        ConfigError: not such a document (``not a dl2 <noun>``), or of another format.
    """
    if not isinstance(data, dict) or data.get("kind") != kind:
        raise ConfigError(f"not a dl2 {noun}")
    if data.get("format") != version:
        raise ConfigError(f"{noun} format {data.get('format')}, this dl2 reads format {version}")
    return data
