"""API keys and their limits for `tk serve --api-keys FILE`, as LibreTranslate's operators use them.

The file has one key per line, optionally followed by the key's requests per minute and characters per request:

    # key                                   requests/minute   characters/request
    3f1c9b2e-team-a                         120               5000
    7d00aa41-batch-job                      -                 20000
    0b5e6c1d-unlimited

`-` or nothing: no limit of that kind beyond the server's own. Blank lines and `#` comments are ignored. Keys are
secrets: no error message, log line or metric names one; an unreadable line is named by its number only.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from toolkit.core.errors import UsageError
from toolkit.serve.middleware import Refused

WINDOW_S = 60.0  # requests per minute, counted over the last minute (a sliding window)
MAX_KEYS = 1_000_000
COMMENT = re.compile(r"(^|\s)#.*")  # a # at a line's start or after a space begins a comment; a key may hold one


@dataclass(frozen=True)
class KeyLimits:
    requests_per_minute: int | None = None
    chars_per_request: int | None = None


def _digest(key: str) -> bytes:
    # Keys are held and looked up by digest: the key itself is not kept in memory, and a lookup's timing tells an
    # attacker about digests, not keys.
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def _limit(field: str, line: int, what: str) -> int | None:
    if field == "-":
        return None
    if not field.isdigit() or int(field) < 1 or int(field) > 10**9:
        raise UsageError(f"api keys file, line {line}: the {what} must be a whole number from 1 to 1000000000, or -; fix that line")
    return int(field)


def parse_keys(text: str) -> dict[bytes, KeyLimits]:
    """The keys of an api keys file's text, by digest; a one-line UsageError naming the line at fault."""
    keys: dict[bytes, KeyLimits] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = COMMENT.sub("", raw).strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) > 3:
            raise UsageError(f"api keys file, line {number}: {len(fields)} fields; write KEY [REQUESTS_PER_MINUTE [CHARS_PER_REQUEST]]")
        if len(fields[0]) < 8:
            raise UsageError(f"api keys file, line {number}: a key of {len(fields[0])} characters is too easy to guess; use 8 or more")
        digest = _digest(fields[0])
        if digest in keys:
            raise UsageError(f"api keys file, line {number}: the key is already given on an earlier line; give each key once")
        rpm = _limit(fields[1], number, "requests per minute") if len(fields) > 1 else None
        chars = _limit(fields[2], number, "characters per request") if len(fields) > 2 else None
        keys[digest] = KeyLimits(rpm, chars)
        if len(keys) > MAX_KEYS:
            raise UsageError(f"api keys file: more than {MAX_KEYS} keys; serve fewer")
    if not keys:
        raise UsageError("the api keys file has no key; write one key per line")
    return keys


def read_keys(path: str | Path) -> dict[bytes, KeyLimits]:
    """The keys of an api keys file; a one-line UsageError when it cannot be read."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"--api-keys {p}: not a file; give a text file with one key per line")
    if p.stat().st_size > 256 * 1024 * 1024:
        raise UsageError(f"--api-keys {p}: larger than 256 MB; give a file of keys only")
    try:
        return parse_keys(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise UsageError(f"--api-keys {p}: not UTF-8 text; save it as UTF-8") from None


class ApiKeys:
    """Checks each request's key and counts it against the key's limits (in one process: each server process or
    replica counts its own requests, see docs/deployment.md)."""

    def __init__(self, keys: dict[bytes, KeyLimits], clock=time.monotonic):
        self.keys = keys
        self.clock = clock
        self.recent: dict[bytes, deque[float]] = {}

    def admit(self, key: str | None, chars: int) -> KeyLimits:
        """The limits of a valid key whose request fits them; Refused (403 or 429) otherwise. `chars`: the request's
        characters, refused above the key's characters per request."""
        if not key:
            raise Refused(403, "Please contact the server operator to get an API key; send it as api_key or Authorization: Bearer")
        digest = _digest(key)
        limits = self.keys.get(digest)
        if limits is None:
            raise Refused(403, "Invalid API key")
        if limits.chars_per_request is not None and chars > limits.chars_per_request:
            raise Refused(400, f"Invalid request: request ({chars}) exceeds text limit ({limits.chars_per_request}) of this API key")
        if limits.requests_per_minute is not None:
            now = self.clock()
            recent = self.recent.setdefault(digest, deque())
            while recent and recent[0] <= now - WINDOW_S:
                recent.popleft()
            if len(recent) >= limits.requests_per_minute:
                wait = max(1, math.ceil(recent[0] + WINDOW_S - now))
                raise Refused(429, f"Slowdown: {limits.requests_per_minute} per 1 minute", {"Retry-After": str(wait)})
            recent.append(now)
        return limits


def request_key(fields: dict, headers) -> str | None:
    """A request's API key: `api_key` in its JSON, form or query fields (LibreTranslate's clients; the npm client names it
    `apiKey`), else an `Authorization: Bearer KEY` header."""
    for name in ("api_key", "apiKey"):
        key = fields.get(name)
        if isinstance(key, str) and key:
            return key
    auth = headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None
