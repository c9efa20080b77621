"""Credentials in URLs (`https://user:pass@host/...`, signed-URL query tokens) never reach a file
of the run, a log line or an error line.

A corpus or model given as a URL with its password inside would otherwise be copied verbatim
into config.yaml, run_info.json (the command), plan.json, the shard manifest, summary.json,
metrics, report.html and the model card (the file people publish), and into the one error line a
failing command prints. Every such writer passes its text through `redact`, which keeps the user
name and replaces the password (or a bare token) by `***`, and replaces the value of a signed
URL's query credentials (`X-Goog-Signature=`, `X-Amz-Signature=`, `sig=`, `token=`, ...) by
`***`. The log handlers (logs.py) and `errors.failure_line` apply it to every line they emit.
The corpus plan, which must open the files again, puts the real credentials back from the config
(`unredact`).

Why a regex and not `urllib.parse`: the text is whole files and messages with URLs inside
(YAML, JSON, a Python repr in an error line), not one URL. The userinfo of a URL is everything
up to the last `@` before the host (RFC 3986): a password may hold `@`, `:`, quotes.
"""

from __future__ import annotations

import json
import re
from typing import Any

# scheme://USERINFO@ where USERINFO runs to the last `@` of the authority (no space, /, ?, #).
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<info>[^\s/?#@]*(?:@[^\s/?#@]*)*)@")
# Query parameters that carry a credential in signed or token-bearing URLs (GCS, S3, Azure SAS, Hub).
_QUERY = re.compile(r"(?i)(?P<key>[?&](?:x-goog-signature|x-goog-credential|x-amz-signature|x-amz-credential|"
                    r"x-amz-security-token|signature|sig|token|access_token|api_key|apikey|key|password)=)"
                    r"(?P<secret>[^&\s#'\"`]+)")


def _hide(match: re.Match) -> str:
    info = match.group("info")
    if not info:
        return match.group(0)
    user, colon, _ = info.partition(":")
    if not colon:  # a bare token (https://TOKEN@host)
        return f"{match.group('scheme')}***@"
    return f"{match.group('scheme')}{user}:***@"


def _hide_query(match: re.Match) -> str:
    return f"{match.group('key')}***" if match.group("secret") != "***" else match.group(0)


def redact(text: str) -> str:
    """`text` with every URL's password (or token) and signed-URL credential replaced by `***`."""
    if "@" in text:
        text = _USERINFO.sub(_hide, text)
    if "=" in text:
        text = _QUERY.sub(_hide_query, text)
    return text


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
    """Put back the credentials of the URLs in `originals` (the config's values) where `text` (JSON,
    as the corpus plan keeps it) has their redacted form."""
    for original in originals:
        for pattern, hide in ((_USERINFO, _hide), (_QUERY, _hide_query)):
            for match in pattern.finditer(original or ""):
                hidden = hide(match)
                if hidden != match.group(0):
                    text = text.replace(json.dumps(hidden)[1:-1], json.dumps(match.group(0))[1:-1])
    return text


class RedactingFormatter:
    """Mixin for a `logging.Formatter`: the formatted line (message, arguments and traceback) redacted."""

    def format(self, record) -> str:  # type: ignore[no-untyped-def]
        return redact(super().format(record))  # type: ignore[misc]
