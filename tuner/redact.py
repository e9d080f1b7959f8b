"""Scrubbing secrets out of text that came from the server, before it is printed, logged or stored.

A server that refuses a key often says which key it refused ("invalid api key Bearer sk-..."), and a
server's log may hold the Authorization header of a request it rejected. That text reaches error
messages, the console, the run directory and Optuna's journal (`fail_reason`), so every place where
server text enters one of those passes it through `redact`:

- the values of the secrets this process holds (`remember_secret`: the engine's API key, registered
  when it is read from the controller's environment), as written and as JSON escapes them;
- whatever follows `Authorization:` and `Bearer`, whichever key it is;
- token shapes that are keys whoever issued them (`sk-...`, `hf_...`, GitHub's and Slack's tokens).

`looks_like_secret` tells a pasted key from the name of a variable, so that a study naming the key
itself where a variable's name belongs is refused without echoing it.
"""

from __future__ import annotations

import json
import logging
import re

__all__ = [
    "REDACTED",
    "SECRET_REFUSED",
    "RedactingFilter",
    "forget_secrets",
    "looks_like_secret",
    "redact",
    "remember_secret",
]

# Not "[redacted]": rich reads square brackets as markup and would print nothing at all.
REDACTED = "<redacted>"

# The pydantic error type of a value refused because it may be a secret: its input is never echoed.
SECRET_REFUSED = "secret_refused"

# Shorter values would match inside ordinary words and numbers; no real key is this short.
_MIN_SECRET_LENGTH = 4

_PATTERNS = (
    # The header's whole value, up to the end of the line or of a quoted string around it.
    re.compile(r"(?i)(authorization\s*[:=]\s*)[^\r\n\"',}]+"),
    re.compile(r"(?i)(\bbearer\s+)[^\s\"',}]+"),
    re.compile(r"()\bsk[-_][A-Za-z0-9_\-]{8,}"),
    re.compile(r"()\bhf_[A-Za-z0-9]{8,}"),
    re.compile(r"()\b(?:ghp|gho|ghu|ghs|ghr|github_pat)_[A-Za-z0-9_]{8,}"),
    re.compile(r"()\bxox[abposr]-[A-Za-z0-9\-]{8,}"),
)

_known: set[str] = set()


def remember_secret(value: str) -> None:
    """From now on `redact` removes `value` from every text, wherever it appears."""
    if len(value) >= _MIN_SECRET_LENGTH:
        _known.add(value)
        _known.add(json.dumps(value)[1:-1])  # as it appears inside a JSON error body


def forget_secrets() -> None:
    """Drops every remembered value (tests that load several engines start from a clean slate)."""
    _known.clear()


def redact(text: str) -> str:
    """`text` with every remembered secret, bearer token, Authorization value and key-shaped token
    replaced by `<redacted>`."""
    # Longest first: a value that contains another is removed whole, not left half-visible.
    for value in sorted(_known, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    for pattern in _PATTERNS:
        text = pattern.sub(lambda match: match.group(1) + REDACTED, text)
    return text


class RedactingFilter(logging.Filter):
    """A log handler's filter that passes every record with its message scrubbed by `redact`."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        scrubbed = redact(message)
        if scrubbed != message:
            record.msg, record.args = scrubbed, None
        return True


_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Keys whose shape is also a valid variable name (the others have a `-` and are no name at all).
_KEY_SHAPED_NAME = re.compile(
    r"(?:hf|ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{16,}|(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{10,}|github_pat_\w{20,}"
)


def looks_like_secret(value: str) -> bool:
    """Whether `value`, given where the name of an environment variable belongs, is rather a key: not a
    variable name at all, a key of a known shape (`hf_...`, `sk_live_...`), or a long run of letters and digits
    without the underscores that separate the words of a name (a hex or base64 key)."""
    if not _VARIABLE_NAME.fullmatch(value):
        return True
    if _KEY_SHAPED_NAME.fullmatch(value):
        return True
    has_digit = any(c.isdigit() for c in value)
    return len(value) >= 24 and "_" not in value and has_digit
