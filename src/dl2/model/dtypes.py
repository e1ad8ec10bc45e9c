"""Bytes per element of the recorded dtypes, and the bytes an op carries."""

from __future__ import annotations

#: Bytes per element of torch dtypes, by the names the recorder writes (``str(dtype)``
#: without ``torch.``), aliases included.
_ITEMSIZE = {
    "float64": 8,
    "double": 8,
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "complex128": 16,
    "cdouble": 16,
    "complex64": 8,
    "cfloat": 8,
    "complex32": 4,
    "chalf": 4,
    "int64": 8,
    "long": 8,
    "int32": 4,
    "int": 4,
    "int16": 2,
    "short": 2,
    "int8": 1,
    "uint64": 8,
    "uint32": 4,
    "uint16": 2,
    "uint8": 1,
    "bool": 1,
    "qint8": 1,
    "quint8": 1,
    "qint32": 4,
    "quint4x2": 1,
    "quint2x4": 1,
    "bits8": 1,
    "bits16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1,
}


def dtype_itemsize(dtype: str | None) -> int | None:
    """Bytes per element of a recorded dtype name, or None if unknown."""
    if dtype is None:
        return None
    return _ITEMSIZE.get(dtype.removeprefix("torch."))


def op_bytes(dtype: str | None, count: int | None) -> int | None:
    """count × itemsize; None when either is unknown (such a send is never eager)."""
    size = dtype_itemsize(dtype)
    if size is None or count is None:
        return None
    return size * count
