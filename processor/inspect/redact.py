"""Nothing secret leaves the inspector.

The inspector never serves its configuration (librdkafka settings may hold
SASL passwords) nor the redrive token.  Session data is the agents' own, but
a header's ``config`` or a tool's arguments may still carry a credential
(an API key passed through by a careless adapter); every JSON document the
API returns goes through :func:`redact`, which replaces the value of any key
that names a secret.  ``maxTokens`` / ``inputTokens`` are counts, not
secrets: only whole-word matches of the names below count.
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "[redacted]"

_SECRET_KEY = re.compile(
    r"(?:^|[-_.])?(?:password|passwd|passphrase|secret|credentials?|api[-_]?key|apikey|"
    r"authorization|auth[-_]?token|access[-_]?token|refresh[-_]?token|id[-_]?token|"
    r"bearer|private[-_]?key|client[-_]?secret|sasl[-_.]?(?:password|username|jaas)|"
    r"cookie|session[-_]?token|^token$)",
    re.IGNORECASE,
)

#: Depth bound: views are validated JSON, but a hostile event can nest deeply.
MAX_DEPTH = 200


def is_secret_key(name: str) -> bool:
    return bool(_SECRET_KEY.search(name))


def redact(value: Any, depth: int = 0) -> Any:
    """A copy of ``value`` with secret-named keys' values replaced."""
    if depth > MAX_DEPTH:
        return "[too deep]"
    if isinstance(value, dict):
        return {
            k: (
                REDACTED
                if isinstance(k, str) and is_secret_key(k) and v is not None
                else redact(v, depth + 1)
            )
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact(v, depth + 1) for v in value]
    return value
