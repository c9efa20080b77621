"""Credentials in URLs (`https://user:pass@host/...`) never reach a file of the run.

A corpus or model given as a URL with its password inside would otherwise be copied verbatim
into config.yaml, run_info.json (the command), plan.json, the shard manifest, summary.json,
metrics, report.html and the model card (the file people publish). Every such writer passes its
text through `redact`, which keeps the user name and replaces the password (or a bare token) by
`***`. The corpus plan, which must open the files again, puts the real credentials back from the
config (`unredact`).
"""

from __future__ import annotations

import re
from typing import Any

_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^\s/@:'\"`]*)(?::(?P<secret>[^\s/@'\"`]*))?@")


def _hide(match: re.Match) -> str:
    if match.group("secret") is None:  # a bare token (https://TOKEN@host)
        return f"{match.group('scheme')}***@" if match.group("user") else match.group(0)
    return f"{match.group('scheme')}{match.group('user')}:***@"


def redact(text: str) -> str:
    """`text` with every URL's password (or token) replaced by `***`."""
    return _USERINFO.sub(_hide, text) if "@" in text else text


def redact_obj(obj: Any) -> Any:
    """`redact` applied to every string inside dicts, lists and tuples."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {k: redact_obj(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact_obj(v) for v in obj)
    return obj


def unredact(text: str, originals: list[str | None]) -> str:
    """Put back the credentials of the URLs in `originals` (the config's values) where `text` has
    their redacted form."""
    for original in originals:
        for match in _USERINFO.finditer(original or ""):
            hidden = _hide(match)
            if hidden != match.group(0):
                text = text.replace(hidden, match.group(0))
    return text
