"""Zarr v3 data types and fill values.

Core types (``bool``, ``int8``..``uint64``, ``float16``..``float64``, ``complex64``/``128``,
``r<bits>``) come from the core spec; the extension types are the ones zarr-python 3 and
tensorstore write (``numpy.datetime64``, ``null_terminated_bytes``, ``string``...). A v3 data
type has no byte order: the ``bytes`` codec chooses it, so NumPy dtypes here are
little-endian and the codec pipeline flips them when it says ``"big"``.

A type is checked without NumPy: each :class:`DataType` holds NumPy's description of it
(a typestr, or a structure's fields) and makes the dtype only when asked, for a decoded view.
The checks run at a mount's first Zarr commit, which would otherwise pay NumPy's import
(docs/performance.md, "A fresh mount's first Zarr metadata: numpy's import"). A structure's
fields are still laid out by NumPy, which alone says what it accepts.
"""

from __future__ import annotations

import base64
import binascii
import functools
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .json_docs import is_int, is_number, short
from .v2_dtypes import DATETIME_UNITS, SPECIAL_FLOATS

if TYPE_CHECKING:
    import numpy as np

CORE_TYPES = {
    "bool": "|b1",
    "int8": "|i1",
    "int16": "<i2",
    "int32": "<i4",
    "int64": "<i8",
    "uint8": "|u1",
    "uint16": "<u2",
    "uint32": "<u4",
    "uint64": "<u8",
    "float16": "<f2",
    "float32": "<f4",
    "float64": "<f8",
    "complex64": "<c8",
    "complex128": "<c16",
}
# Registered or tensorstore-written low-precision types: known names (so no "unknown type"
# warning) and an item size for fill-value checks, but no NumPy dtype for the decoded view.
EXTRA_FLOAT_TYPES = {
    "bfloat16": 2,
    "float8_e3m4": 1,
    "float8_e4m3": 1,
    "float8_e4m3fn": 1,
    "float8_e4m3fnuz": 1,
    "float8_e4m3b11fnuz": 1,
    "float8_e5m2": 1,
    "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1,
    "float4_e2m1fn": 1,
    "float6_e2m3fn": 1,
    "float6_e3m2fn": 1,
}
EXTRA_INT_TYPES = {"int2": (-2, 1), "int4": (-8, 7), "uint2": (0, 3), "uint4": (0, 15)}
STRING_TYPES = frozenset({"string", "variable_length_utf8"})
VLEN_BYTES_TYPES = frozenset({"variable_length_bytes", "bytes"})
_CATEGORIES = {"b": "bool", "i": "int", "u": "int", "f": "float", "c": "complex"}
_RAW_BITS = re.compile(r"^r([1-9][0-9]*)$")


class DataTypeError(ValueError):
    """A v3 ``data_type`` that is not valid; ``rule`` is the rule suffix to report under."""

    def __init__(self, rule: str, message: str):
        super().__init__(message)
        self.rule = rule


@dataclass(frozen=True)
class DataType:
    """What this layer knows about one v3 data type.

    ``category`` drives fill-value checks: ``bool``, ``int``, ``float``, ``complex``, ``raw``
    (``r<bits>``), ``time``, ``bytes`` (fixed, base64 fill), ``str`` (fixed UTF-32),
    ``vlen-str``, ``vlen-bytes``, ``struct`` or ``unknown``. ``descr`` is what ``np.dtype``
    takes for the little-endian NumPy dtype when there is one (a typestr, or a structure's
    ``(name, descr)`` fields), and :attr:`dtype` that dtype; ``itemsize`` is ``None`` for
    variable-length types.
    """

    name: str
    category: str
    descr: Any
    itemsize: int | None
    known: bool = True

    @functools.cached_property
    def dtype(self) -> np.dtype | None:
        """The little-endian NumPy dtype, made (and NumPy imported) at the first ask; None
        also where NumPy has none (a ``null_terminated_bytes`` of 2**40 bytes: the spec allows
        it, so the checks pass it, and a decoded view calls it unsupported)."""
        if self.descr is None:
            return None
        import numpy as np

        try:
            return np.dtype(self.descr)
        except (TypeError, ValueError):
            return None

    @property
    def variable_length(self) -> bool:
        """True for types whose items have no fixed size (``string``, ``variable_length_bytes``)."""
        return self.category in ("vlen-str", "vlen-bytes")


def _length_bytes(config: Any, name: str, multiple: int = 1) -> int:
    n = config.get("length_bytes") if isinstance(config, dict) else None
    if not is_int(n) or n < 1 or n % multiple:
        raise DataTypeError(
            "data-type-configuration",
            f"{name} needs configuration.length_bytes, a positive integer"
            + (f" multiple of {multiple}" if multiple > 1 else "")
            + f"; got {short(config)}",
        )
    return n


def parse_data_type(obj: Any, depth: int = 0) -> DataType:
    """Parse a v3 ``data_type`` value (short-hand name or extension object).

    Unknown names give a :class:`DataType` with ``known=False`` rather than an error: a writer
    newer than this layer may know them. Raises :class:`DataTypeError` for malformed values,
    including ``"must_understand": false``, which the spec does not allow on data types.
    """
    if isinstance(obj, str):
        name, config = obj, None
    elif isinstance(obj, dict):
        name, config = obj.get("name"), obj.get("configuration")
        if not isinstance(name, str):
            raise DataTypeError("data-type", f"data_type object needs a string 'name', got {short(obj)}")
        if obj.get("must_understand", True) is not True:
            raise DataTypeError("must-understand", "data_type may not be marked must_understand: false")
        if config is not None and not isinstance(config, dict):
            raise DataTypeError(
                "data-type-configuration", f"configuration must be an object, got {short(config)}"
            )
    else:
        raise DataTypeError("data-type", f"data_type must be a name or an object, got {short(obj)}")

    core = CORE_TYPES.get(name)
    if core is not None:
        return DataType(name, _CATEGORIES[core[1]], core, int(core[2:]))
    m = _RAW_BITS.fullmatch(name)
    if m:
        bits = int(m.group(1))
        if bits % 8:
            raise DataTypeError("data-type", f"{name}: raw types need a multiple of 8 bits")
        return DataType(name, "raw", f"|V{bits // 8}", bits // 8)
    if name in ("numpy.datetime64", "numpy.timedelta64"):
        unit = config.get("unit") if config else None
        scale = config.get("scale_factor", 1) if config else 1
        if unit not in DATETIME_UNITS or not is_int(scale) or not 1 <= scale < 2**31:
            raise DataTypeError(
                "data-type-configuration",
                f"{name} needs configuration {{unit, scale_factor}} with a NumPy unit, got {short(config)}",
            )
        code = "M8" if name.endswith("datetime64") else "m8"
        return DataType(name, "time", f"<{code}[{scale if scale != 1 else ''}{unit}]", 8)
    if name == "null_terminated_bytes":
        n = _length_bytes(config, name)
        return DataType(name, "bytes", f"|S{n}", n)
    if name == "raw_bytes":
        n = _length_bytes(config, name)
        return DataType(name, "bytes", f"|V{n}", n)
    if name == "fixed_length_utf32":
        n = _length_bytes(config, name, 4)
        return DataType(name, "str", f"<U{n // 4}", n)
    if name in STRING_TYPES:
        return DataType(name, "vlen-str", None, None)
    if name in VLEN_BYTES_TYPES:
        return DataType(name, "vlen-bytes", None, None)
    if name == "structured":
        fields = config.get("fields") if config else None
        if not isinstance(fields, list) or not fields or depth > 32:
            raise DataTypeError(
                "data-type-configuration", f"structured needs a non-empty fields list, got {short(config)}"
            )
        descr = []
        for f in fields:
            if not (isinstance(f, list) and len(f) == 2 and isinstance(f[0], str)):
                raise DataTypeError(
                    "data-type-configuration", f"structured field {short(f)} is not [name, data_type]"
                )
            sub = parse_data_type(f[1], depth + 1)
            if sub.descr is None:
                raise DataTypeError("data-type-configuration", f"structured field {f[0]!r} has no fixed size")
            descr.append((f[0], sub.descr))
        import numpy as np

        try:
            dt = np.dtype(descr)
        except (TypeError, ValueError) as exc:
            raise DataTypeError(
                "data-type-configuration", f"structured fields refused by NumPy: {exc}"
            ) from None
        return DataType(name, "struct", descr, dt.itemsize)
    if name in EXTRA_FLOAT_TYPES:
        return DataType(name, "float", None, EXTRA_FLOAT_TYPES[name])
    if name in EXTRA_INT_TYPES:
        return DataType(name, "int", None, 1)
    return DataType(name, "unknown", None, None, known=False)


def _b64(value: Any) -> bytes | None:
    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        return None


def _float_ok(v: Any, itemsize: int | None) -> str | None:
    """None when ``v`` is a valid v3 float fill value; else a reason."""
    if is_number(v) or (isinstance(v, str) and v in SPECIAL_FLOATS):
        return None
    if isinstance(v, str) and v.startswith("0x"):
        digits = v[2:]
        if itemsize and len(digits) != 2 * itemsize:
            return f"hex float {v!r} needs {2 * itemsize} hex digits"
        try:
            bytes.fromhex(digits)
        except ValueError:
            return f"{v!r} is not hexadecimal"
        return None
    return f"{short(v)} is not a number, 'NaN', 'Infinity', '-Infinity' or a '0x' hex bit pattern"


def _floatish(text: str) -> bool:
    # zarr-python reads "1.5" (and "nan") as floats; the spec's strings are only the three.
    try:
        float(text)
    except ValueError:
        return False
    return True


def _intish(text: str) -> int | None:
    # zarr-python reads integer fill values given as strings ("42"); nobody should write them.
    try:
        return int(text)
    except ValueError:
        return None


def check_fill_value(fill: Any, dt: DataType) -> tuple[str, str] | None:
    """Check a v3 ``fill_value`` for data type ``dt``; ``None`` or ``(severity, message)``.

    The spec requires a fill value, so ``null`` is refused for every type this layer knows.
    """
    if not dt.known:
        return None
    if fill is None:
        return "error", f"fill_value is required for {dt.name} (null is not a {dt.name} value)"
    cat = dt.category
    if cat == "bool":
        return None if isinstance(fill, bool) else ("error", f"{short(fill)} is not true or false")
    if cat == "int":
        if dt.descr is not None:
            bits = 8 * dt.itemsize
            lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if dt.descr[1] == "i" else (0, 2**bits - 1)
        else:
            lo, hi = EXTRA_INT_TYPES[dt.name]
        if is_int(fill):
            return None if lo <= fill <= hi else ("error", f"{fill} is outside [{lo}, {hi}]")
        if isinstance(fill, float) and math.isfinite(fill) and fill.is_integer() and lo <= fill <= hi:
            return "warning", f"integer fill_value written as the float {fill}"
        if isinstance(fill, str) and _intish(fill) is not None and lo <= _intish(fill) <= hi:
            return "warning", f"integer fill_value written as the string {fill!r}"
        return "error", f"{short(fill)} is not an integer"
    if cat == "float":
        why = _float_ok(fill, dt.itemsize)
        if why is not None and isinstance(fill, str) and not fill.startswith("0x") and _floatish(fill):
            return "warning", f"float fill_value written as the string {fill!r}"
        return None if why is None else ("error", why)
    if cat == "complex":
        if not (isinstance(fill, list) and len(fill) == 2):
            return "error", f"{short(fill)} is not [real, imag]"
        for part in fill:
            why = _float_ok(part, dt.itemsize // 2 if dt.itemsize else None)
            if why:
                return "error", why
        return None
    if cat == "raw":
        if (
            isinstance(fill, list)
            and len(fill) == dt.itemsize
            and all(is_int(b) and 0 <= b <= 255 for b in fill)
        ):
            return None
        return "error", f"{short(fill)} is not a list of {dt.itemsize} byte values (0-255)"
    if cat == "time":
        if (is_int(fill) and -(2**63) <= fill < 2**63) or fill == "NaT":
            return None
        return "error", f"{short(fill)} is not an int64 count of units or 'NaT'"
    if cat == "bytes":
        if isinstance(fill, list) and all(is_int(b) and 0 <= b <= 255 for b in fill):
            raw: bytes | None = bytes(fill)
        else:
            raw = _b64(fill)
        if raw is None:
            return "error", f"{short(fill)} is not a base64 string"
        if len(raw) > dt.itemsize:
            return "error", f"fill_value holds {len(raw)} bytes, more than {dt.itemsize}"
        return None
    if cat == "str":
        if not isinstance(fill, str):
            return "error", f"{short(fill)} is not a string"
        if len(fill) > dt.itemsize // 4:
            return "warning", f"fill_value is longer than {dt.itemsize // 4} characters"
        return None
    if cat in ("vlen-str", "vlen-bytes"):
        return None if isinstance(fill, str) else ("error", f"{short(fill)} is not a string")
    if cat == "struct":
        raw = _b64(fill)
        if raw is None:
            return "error", f"{short(fill)} is not a base64 string"
        if len(raw) != dt.itemsize:
            return "error", f"fill_value holds {len(raw)} bytes, the structure has {dt.itemsize}"
        return None
    return None


def _float_value(v: Any, dtype: np.dtype) -> Any:
    import numpy as np

    if isinstance(v, str) and v.startswith("0x"):
        return np.frombuffer(bytes.fromhex(v[2:]), dtype=dtype.newbyteorder(">"))[0].astype(dtype)
    return dtype.type(SPECIAL_FLOATS.get(v, v) if isinstance(v, str) else v)


def decode_fill_value(fill: Any, dt: DataType) -> Any:
    """Return the NumPy scalar for a checked v3 fill value (``None`` when there is no dtype)."""
    dtype = dt.dtype
    if dtype is None or fill is None:
        return None
    import numpy as np

    cat = dt.category
    if cat == "float":
        return _float_value(fill, dtype)
    if cat == "complex":
        part = np.dtype(f"<f{dtype.itemsize // 2}")
        return dtype.type(complex(float(_float_value(fill[0], part)), float(_float_value(fill[1], part))))
    if cat == "raw":
        return np.frombuffer(bytes(fill), dtype=dtype)[0]
    if cat == "time":
        if fill == "NaT":
            return np.array("NaT", dtype=dtype)[()]
        return np.array(fill, dtype="<i8").view(dtype)[()]
    if cat in ("bytes", "struct"):
        raw = bytes(fill) if isinstance(fill, list) else (_b64(fill) or b"")
        return np.frombuffer(raw.ljust(dtype.itemsize, b"\x00")[: dtype.itemsize], dtype=dtype)[0]
    if cat == "str":
        return np.array(fill, dtype=dtype)[()]
    return np.array(fill).astype(dtype)[()]
