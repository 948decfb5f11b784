"""Secret redaction, applied on ingestion so no later output (text, JSON, web, exporter, bundle) can leak.

Redacted: ``api_key``, ``admin_api_key`` and any key whose name looks like a key, token, secret,
password or credential; credentials inside URLs (``https://user:pass@host`` → ``https://***@host``);
``--api-key VALUE`` style pairs inside command lines, and quoted dict keys with a secret-looking name
(``'api_key': '…'``) inside text.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

REDACTED = "***"

_SECRET_KEY_RE = re.compile(
    r"(?:^|_|-)(?:api_?key|key|token|secret|password|passwd|pwd|credentials?|auth|authorization|cookie)s?(?:$|_|-)",
    re.IGNORECASE,
)
# Keys that merely contain "key"/"token" but are not secrets (sizes, counts, flags).
_NOT_SECRET = re.compile(
    r"(?:tokens?_(?:size|len|num|ratio|usage|budget|per|limit|buckets?|id|map|interval)|(?:max|min|num|total|chunk|prefill|new|cached|pending|draft|page|context)_.*token|token_?(?:izer|s_total|_usage)|^(?:skip_tokenizer_init|tokenizer.*|bucket_.*|key_?(?:s|value)?_?(?:dtype|layout)|.*_keys_active|kv_.*)$)",
    re.IGNORECASE,
)
_URL_CRED_RE = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<cred>[^/@\s:]+(?::[^/@\s]*)?)@")
_CLI_SECRET_RE = re.compile(
    r"(--(?:admin-)?api-key|--[\w-]*(?:token|secret|password)[\w-]*)(=|\s+)(\S+)", re.IGNORECASE
)
_INLINE_SECRET_RE = re.compile(
    r"""(?P<k>[\w-]*(?:api[_-]?key|secret|password|passwd|token|credential)[\w-]*)(?P<q>["']?)(?P<sep>\s*[=:]\s*)(?P<v>'[^']*'|"[^"]*"|[^,\s)}]+)""",
    re.IGNORECASE,
)
# quoted dict keys with a string value, as in the ``server_args={'api_key': '…'}`` log line
_QUOTED_KV_RE = re.compile(r"""(['"])([\w.-]+)\1(\s*:\s*)('[^']*'|"[^"]*")""")
_NUMBER_RE = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")


def is_secret_key(key: str) -> bool:
    return _is_secret_key(str(key))


@lru_cache(maxsize=4096)  # the same few hundred server-args keys are asked about on every redaction
def _is_secret_key(k: str) -> bool:
    # the cheap test first: _NOT_SECRET (leading-wildcard alternatives) costs ~10x more per key and only
    # matters for the few keys _SECRET_KEY_RE flags (a server_args line has ~550 keys; start-up time)
    return bool(_SECRET_KEY_RE.search(k)) and not _NOT_SECRET.search(k)


# Every text the patterns below can change holds an "@" (URL credentials) or one of these words (each
# secret-key pattern and each name is_secret_key accepts contains one): the rest is returned as it is,
# with one search instead of four substitutions (a server_args line has ~550 values; start-up time).
_HINT_RE = re.compile(r"key|token|secret|passw|pwd|credential|auth|cookie", re.IGNORECASE)


def redact_text(text: str) -> str:
    """Redact URL credentials, ``--api-key X`` pairs and ``api_key='x'`` assignments inside free text."""
    if not text or ("@" not in text and not _HINT_RE.search(text)):
        return text
    return _redact_text(text)


def _redact_text(text: str) -> str:
    text = _URL_CRED_RE.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    def _cli(m: re.Match[str]) -> str:
        if not is_secret_key(m.group(1).lstrip("-").replace("-", "_")) or _NUMBER_RE.match(m.group(3)):
            return m.group(0)
        return f"{m.group(1)}{m.group(2)}{REDACTED}"

    text = _CLI_SECRET_RE.sub(_cli, text)

    def _inline(m: re.Match[str]) -> str:
        if not is_secret_key(m.group("k")):
            return m.group(0)
        val = m.group("v")
        if val in ("None", "null", "''", '""', "True", "False", "true", "false") or _NUMBER_RE.match(val):
            return m.group(0)
        quote = '"' if val.startswith('"') else "'"
        return f"{m.group('k')}{m.group('q')}{m.group('sep')}{quote}{REDACTED}{quote}"

    text = _INLINE_SECRET_RE.sub(_inline, text)

    def _quoted(m: re.Match[str]) -> str:
        if not is_secret_key(m.group(2)) or m.group(4) in ("''", '""'):
            return m.group(0)
        return f"{m.group(1)}{m.group(2)}{m.group(1)}{m.group(3)}'{REDACTED}'"

    return _QUOTED_KV_RE.sub(_quoted, text)


def redact_value(key: str, value: Any) -> Any:
    """Redact the value of a secret-named key. Only text can hold a secret: numbers and booleans under a
    key such as ``token_capacity`` are kept (they are sizes, not credentials)."""
    if is_secret_key(key):
        if isinstance(value, str):
            return REDACTED if value else value
        if isinstance(value, dict):
            return {k: redact_value(key, v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [redact_value(key, v) for v in value]
        if isinstance(value, bytes):
            return REDACTED
        return value
    return redact(value)


def redact(obj: Any) -> Any:
    """Deep-copy ``obj`` with secrets replaced. Strings are scanned for URL credentials."""
    if isinstance(obj, dict):
        return {k: redact_value(str(k), v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [redact(v) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj)
    return obj
