"""The one rule for what a record's text field may hold, the same for every reader (so a format decides
nothing about which records count).

Why one module: each reader (JSON lines, parquet, CSV, Hugging Face datasets) used to turn whatever
the field held into `str(value)`, so a dict trained as its Python repr. The rule:

- a string is text;
- null / a missing field is skipped and counted (the manifest's `skipped_records`);
- a list of strings is an error unless `corpus.text_lists=join` (then its items become lines);
- anything else is a one-line error naming the file, the record and the field's type.

Typed tables (parquet, Arrow-backed datasets) are checked once by their column type at planning
(`check_arrow_type`); JSON lines value by value (`text_of`).
"""

from __future__ import annotations

from typing import Any

from tpu_ray.errors import UserError

TEXT_LISTS = ("error", "join")  # corpus.text_lists: what a list of strings becomes


def _type_name(value: Any) -> str:
    return {dict: "object (dict)", list: "list", bool: "boolean", int: "number", float: "number"}.get(
        type(value), type(value).__name__)


def text_of(value: Any, source: str, where: str, field: str, lists: str = "error") -> str | None:
    """The text of one record's field, or None when it is to be skipped (null or missing).

    `where` names the record (e.g. "line 12" or "row 7"); errors are one line with the fix.
    """
    if isinstance(value, str):
        return value
    if value is None:
        return None
    if isinstance(value, list) and all(isinstance(v, str) or v is None for v in value):
        if lists == "join":
            return "\n".join(v for v in value if v is not None)
        raise UserError(f"{source}: {where}: field {field!r} is a list of strings, not a string; set "
                        f"corpus.text_lists=join to train on its items as lines, or pick another field")
    raise UserError(f"{source}: {where}: field {field!r} is a {_type_name(value)}, not text; set "
                    f"corpus.text_field to the field that holds the text")


def check_arrow_type(arrow_type: Any, source: str, field: str, lists: str = "error") -> bool:
    """Check a typed column once for all its rows; returns True when it is a list column to join.

    Strings (and large strings) are text; a list of strings needs `corpus.text_lists=join`; any
    other type is refused (whatever its rows hold, none of them is text).
    """
    import pyarrow as pa

    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or pa.types.is_null(arrow_type):
        return False
    if (pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)) and (
            pa.types.is_string(arrow_type.value_type) or pa.types.is_large_string(arrow_type.value_type)):
        if lists == "join":
            return True
        raise UserError(f"{source}: column {field!r} holds lists of strings ({arrow_type}), not strings; set "
                        f"corpus.text_lists=join to train on their items as lines, or pick another column")
    raise UserError(f"{source}: every row: column {field!r} has type {arrow_type}, not text (string); set "
                    f"corpus.text_field to the column that holds the text")


def arrow_texts(column: Any, joined: bool) -> tuple[list[str], int]:
    """(texts, nulls skipped) of an Arrow string or list-of-string array (already type-checked)."""
    values = column.to_pylist()
    out = []
    skipped = 0
    for v in values:
        if v is None:
            skipped += 1
        elif joined:
            out.append("\n".join(s for s in v if s is not None))
        else:
            out.append(v)
    return out, skipped
