"""Zarr v2 (and v1) data types and fill values: JSON form -> NumPy, with the spec's checks.

The v2 spec encodes a simple dtype as a NumPy typestr with an explicit byte order
(``"<f8"``, ``"|S12"``, ``"<M8[ns]"``) and a structured dtype as a list of
``[name, type(, shape)]`` lists, nested as deep as needed.

NumPy is imported by the functions that make its dtypes, not with the module: the v3 checks
use this module's tables, and a v3 type is checked without NumPy (:mod:`.v3_dtypes`). The v2
checks take a simple type of a size every platform's NumPy has as a :class:`SimpleType`, which
holds what they need of it without NumPy (:func:`check_dtype`); a structure, and a long double,
whose sizes differ between platforms, are still made by NumPy.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import sys
from typing import TYPE_CHECKING, Any

from .json_docs import is_int, is_number, short

if TYPE_CHECKING:
    import numpy as np

_TYPESTR = re.compile(r"^([<>|])([biufcmMSUVO])(\d*)(\[([0-9]*)([A-Za-z]+)\])?$")
DATETIME_UNITS = frozenset({"Y", "M", "W", "D", "h", "m", "s", "ms", "us", "ns", "ps", "fs", "as"})
SPECIAL_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
# Sizes that NumPy gives a meaning to, per kind; anything else is refused before asking NumPy,
# which would otherwise raise an unhelpful TypeError.
_SIZES = {
    "b": {1},
    "i": {1, 2, 4, 8},
    "u": {1, 2, 4, 8},
    "f": {2, 4, 8, 10, 12, 16},
    "c": {8, 16, 20, 24, 32},
}


class DtypeError(ValueError):
    """The JSON form of a data type is not a valid v2 data type; the message says why."""

    def __init__(self, rule: str, message: str):
        super().__init__(message)
        self.rule = rule


# Sizes of each kind every platform's NumPy has (a long double's, 10 to 16 bytes, it has or not).
_PORTABLE = {"b": {1}, "i": {1, 2, 4, 8}, "u": {1, 2, 4, 8}, "f": {2, 4, 8}, "c": {8, 16}}
_NAMES = {"b": "bool", "i": "int", "u": "uint", "f": "float", "c": "complex"}
_FOREIGN = ">" if sys.byteorder == "little" else "<"  # the byte order NumPy prints as a typestr


class SimpleType:
    """A simple v2 data type as the checks see it, without NumPy: its kind (NumPy's letter),
    item size, whether it holds objects, and, as :func:`str`, NumPy's name of it (what the
    checks' messages print)."""

    __slots__ = ("typestr", "kind", "itemsize", "hasobject")

    def __init__(self, typestr: str, kind: str, itemsize: int) -> None:
        self.typestr, self.kind, self.itemsize = typestr, kind, itemsize
        self.hasobject = kind == "O"

    def __str__(self) -> str:
        kind, order, size = self.kind, self.typestr[0], self.itemsize
        if kind == "O":
            return "object"
        if kind in "SV":
            return f"|{kind}{size}"
        if order == _FOREIGN and size > 1:  # NumPy names only this machine's byte order
            return self.typestr
        if kind in "mM":
            return ("datetime64" if kind == "M" else "timedelta64") + self.typestr[3:]
        if kind == "U":
            return self.typestr
        return "bool" if kind == "b" else f"{_NAMES[kind]}{size * 8}"


def check_typestr(s: str) -> SimpleType | None:
    """Check one simple v2 typestr such as ``"<f8"`` (raise :class:`DtypeError` if invalid):
    its :class:`SimpleType`, or None for a size only some platforms' NumPy has (ask it)."""
    m = _TYPESTR.fullmatch(s)
    if m is None:
        raise DtypeError("dtype", f"{s!r} is not a NumPy typestr with a byte order (e.g. '<f8', '|u1')")
    order, kind, size, unit_part, _mult, unit = m.groups()
    if kind == "O":
        # zarr-python writes "|O"; the object codec in filters says how to (de)serialise.
        if size not in ("", "4", "8") or unit_part:
            raise DtypeError("dtype", f"{s!r}: object dtype is written '|O'")
        return SimpleType(s, "O", 8)
    if not size:
        raise DtypeError("dtype", f"{s!r} has no item size")
    n = int(size)
    if kind in "mM":
        if n != 8:
            raise DtypeError("dtype", f"{s!r}: datetime and timedelta types are 8 bytes")
        if unit_part is None:
            raise DtypeError("dtype-datetime-unit", f"{s!r} has no unit; write e.g. '<M8[ns]'")
        if unit not in DATETIME_UNITS:
            raise DtypeError("dtype-datetime-unit", f"{s!r}: unknown time unit {unit!r}")
    elif unit_part is not None:
        raise DtypeError("dtype", f"{s!r}: only M8/m8 take a [unit]")
    if kind in _SIZES and n not in _SIZES[kind]:
        raise DtypeError("dtype", f"{s!r}: no {kind!r} type has {n} bytes")
    if kind in "SUV" and n < 1:
        raise DtypeError("dtype", f"{s!r}: zero-length items cannot hold data")
    itemsize = n * 4 if kind == "U" else n
    if order == "|" and itemsize > 1 and kind not in "SV":
        raise DtypeError(
            "dtype-byteorder", f"{s!r}: a {itemsize}-byte type needs an explicit byte order '<' or '>'"
        )
    if kind in _PORTABLE and n not in _PORTABLE[kind]:
        return None
    return SimpleType(s, kind, itemsize)


def parse_typestr(s: str) -> np.dtype:
    """Parse one simple v2 typestr such as ``"<f8"``; raise :class:`DtypeError` if invalid."""
    import numpy as np

    check_typestr(s)
    try:
        return np.dtype(object) if s[1] == "O" else np.dtype(s)
    except TypeError as exc:
        raise DtypeError("dtype", f"{s!r}: NumPy refuses it ({exc})") from None


def check_dtype(obj: Any) -> SimpleType | np.dtype:
    """A v2 ``dtype`` value as the checks need it (:func:`parse_dtype`'s errors): a simple type
    of a size every platform has as a :class:`SimpleType`, without NumPy; the others as
    NumPy's dtype."""
    if isinstance(obj, str):
        simple = check_typestr(obj)
        if simple is not None:
            return simple
    return parse_dtype(obj)


def _to_numpy_descr(obj: Any, depth: int = 0) -> Any:
    """Turn the JSON form into what ``np.dtype`` takes, checking the structure on the way."""
    if isinstance(obj, str):
        parse_typestr(obj)
        return obj
    if not isinstance(obj, list) or not obj:
        raise DtypeError("dtype", f"{short(obj)} is neither a typestr nor a non-empty list of fields")
    if depth > 32:
        raise DtypeError("dtype", "structured dtype nested too deep")
    fields = []
    names = set()
    for field in obj:
        if not isinstance(field, list) or len(field) not in (2, 3):
            raise DtypeError("dtype", f"field {short(field)} is not [name, type] or [name, type, shape]")
        name, ftype = field[0], field[1]
        if not isinstance(name, str):
            raise DtypeError("dtype", f"field name {short(name)} is not a string")
        if name and name in names:
            raise DtypeError("dtype", f"field name {name!r} appears twice")
        names.add(name)
        item: tuple = (name, _to_numpy_descr(ftype, depth + 1))
        if len(field) == 3:
            shape = field[2]
            if not isinstance(shape, list) or not all(is_int(d) and d >= 0 for d in shape):
                raise DtypeError("dtype", f"field {name!r}: shape {short(shape)} is not a list of integers")
            item += (tuple(shape),)
        fields.append(item)
    return fields


def parse_dtype(obj: Any) -> np.dtype:
    """Parse a v2 ``dtype`` value (typestr or structured list) into a NumPy dtype.

    Raises :class:`DtypeError` with a rule suffix (``"dtype"``, ``"dtype-byteorder"``,
    ``"dtype-datetime-unit"``) and a message.
    """
    descr = _to_numpy_descr(obj)
    if isinstance(descr, str):
        return parse_typestr(descr)
    import numpy as np

    try:
        return np.dtype(descr)
    except (TypeError, ValueError) as exc:
        raise DtypeError("dtype", f"{short(obj)}: NumPy refuses it ({exc})") from None


def _b64(value: str) -> bytes | None:
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        return None


def _float_ok(v: Any) -> bool:
    return is_number(v) or (isinstance(v, str) and v in SPECIAL_FLOATS)


def _intish(text: str) -> int | None:
    # zarr-python reads integer fill values given as strings ("42"); nobody should write them.
    try:
        return int(text)
    except ValueError:
        return None


def check_fill_value(fill: Any, dtype: SimpleType | np.dtype) -> tuple[str, str] | None:
    """Check a v2 ``fill_value`` against its dtype.

    Returns ``None`` when fine, else ``(severity, message)``. Warnings cover forms the spec does
    not bless but zarr-python still reads (an integral float for an integer type, 0/1 for bool,
    a non-base64 string for ``S``), so refusing them would break existing data.
    """
    if fill is None or dtype.hasobject:
        # null is always allowed; object arrays serialise their fill value through the
        # object codec, so any JSON value may be right.
        return None
    kind = dtype.kind
    if kind == "b":
        if isinstance(fill, bool):
            return None
        if is_int(fill) and fill in (0, 1):
            return "warning", f"bool fill_value written as {fill}; the spec form is true/false"
        return "error", f"{short(fill)} is not a bool"
    if kind in "iu":
        bits = dtype.itemsize * 8
        low, high = (0, 2**bits - 1) if kind == "u" else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        if is_int(fill):
            if low <= fill <= high:
                return None
            return "error", f"{fill} is outside the range of {dtype} [{low}, {high}]"
        if isinstance(fill, float) and math.isfinite(fill) and fill.is_integer() and low <= fill <= high:
            return "warning", f"integer fill_value written as the float {fill}"
        if isinstance(fill, str) and _intish(fill) is not None and low <= _intish(fill) <= high:
            return "warning", f"integer fill_value written as the string {fill!r}"
        return "error", f"{short(fill)} is not an integer"
    if kind == "f":
        if _float_ok(fill):
            return None
        if isinstance(fill, str):
            try:
                float(fill)
            except ValueError:
                pass
            else:
                return "warning", f"float fill_value written as the string {fill!r}"
        return "error", f"{short(fill)} is not a number, 'NaN', 'Infinity' or '-Infinity'"
    if kind == "c":
        if isinstance(fill, list) and len(fill) == 2 and all(_float_ok(x) for x in fill):
            return None
        return "error", f"{short(fill)} is not [real, imag]"
    if kind in "mM":
        if (is_int(fill) and -(2**63) <= fill < 2**63) or fill == "NaT":
            return None
        return "error", f"{short(fill)} is not an int64 count of units (or 'NaT')"
    if kind == "S":
        if isinstance(fill, str):
            raw = _b64(fill)
            if raw is None:
                return "warning", f"{short(fill)} is not base64 (the spec requires it for S types)"
            if len(raw) > dtype.itemsize:
                return "error", f"base64 fill_value decodes to {len(raw)} bytes, more than {dtype.itemsize}"
            return None
        if is_int(fill) and fill == 0:
            return "warning", "S fill_value 0 predates the base64 rule"
        return "error", f"{short(fill)} is not a base64 string"
    if kind == "V":
        if not isinstance(fill, str):
            return "error", f"{short(fill)} is not a base64 string"
        raw = _b64(fill)
        if raw is None:
            return "error", f"{short(fill)} is not valid base64"
        if len(raw) > dtype.itemsize:
            return "error", f"base64 fill_value decodes to {len(raw)} bytes, more than {dtype.itemsize}"
        if len(raw) < dtype.itemsize:
            return "warning", f"base64 fill_value decodes to {len(raw)} bytes, fewer than {dtype.itemsize}"
        return None
    if kind == "U":
        if isinstance(fill, str):
            if len(fill) > dtype.itemsize // 4:
                return (
                    "warning",
                    f"fill_value {short(fill)} is longer than the {dtype.itemsize // 4} characters",
                )
            return None
        return "error", f"{short(fill)} is not a string"
    return None


def decode_fill_value(fill: Any, dtype: np.dtype) -> Any:
    """Return the NumPy scalar a v2 ``fill_value`` stands for (``None`` stays ``None``).

    Assumes :func:`check_fill_value` found no error.
    """
    if fill is None or dtype.hasobject:
        return None if fill is None else fill
    import numpy as np

    kind = dtype.kind
    if kind == "f":
        return dtype.type(SPECIAL_FLOATS.get(fill, fill) if isinstance(fill, str) else fill)
    if kind == "c":
        re_, im = (SPECIAL_FLOATS.get(x, x) if isinstance(x, str) else x for x in fill)
        return dtype.type(complex(float(re_), float(im)))
    if kind in "mM":
        if fill == "NaT":
            return np.array("NaT", dtype=dtype)[()]
        return np.array(fill, dtype="<i8").view(dtype)[()]
    if kind in "SV":
        raw = _b64(fill) if isinstance(fill, str) else None
        if raw is None:
            raw = str(fill).encode() if kind == "S" else b""
        raw = raw.ljust(dtype.itemsize, b"\x00")[: dtype.itemsize]
        return np.frombuffer(raw, dtype=dtype)[0]
    if kind == "U":
        return np.array(fill, dtype=dtype)[()]
    return np.array(fill).astype(dtype)[()]
