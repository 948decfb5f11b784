"""Secret redaction: the one path every input and every output goes through.

Applied twice on purpose: on ingestion (server info, log lines, scrapes, recordings as they are read:
:func:`redact`, by key name and by text), and again at every output boundary (the JSON report and the
text built from it, each web page and JSON twin, exporter labels, bundle records, the replay-server's
answers, usage errors: :func:`redact_strings`, by text, since those documents' keys are diagnoser's own),
so that no route from an input to an output can skip it.

Redacted, wherever it appears (inside JSON, JSON held in strings at any depth, command lines, dict
reprs, free text):

* values under a key whose name looks like a key, token, secret, password, credential, auth header or
  cookie (``api_key``, ``admin_api_key``, ``hf_token``, ``clientSecret``, ``Authorization``…), except
  numbers and booleans (``token_capacity`` is a size) and names that are sizes or counts
  (``max_total_tokens``, ``tokenizer_path``);
* credentials in URLs: ``scheme://user:pass@host``, ``scheme://:pass@host`` (empty user),
  ``scheme://token@host``, passwords holding ``@`` (up to the last ``@`` of the authority), and
  ``user:pass@host`` without a scheme;
* ``--api-key VALUE`` / ``--hf-token=VALUE`` pairs in command lines;
* ``Bearer X`` anywhere, and ``Authorization: Basic X`` (or any scheme) after an auth-like key.

The authority of a URL ends at its first ``/``, ``?`` or ``#`` (RFC 3986), but people paste passwords
holding a raw ``/`` (``redis://u:pa/ss@host``): a ``user:…/…@host`` userinfo is hidden whole too, unless
what follows the colon is a port (digits, then ``/``). Also hidden: ``pass``/``passphrase`` keys, an
Azure SAS signature (``sig=…``), and the whole of a quoted multi-word flag value (``--api-key 'a b'``).

Total on any input: a structure nested deeper than :data:`MAX_DEPTH` is cut there (the deeper part is
replaced by a sentence, never recursed into), and lone surrogates (``"\\ud800"`` in JSON) become U+FFFD,
so that every output can encode what redaction returns.
"""

from __future__ import annotations

import re
from functools import lru_cache
from itertools import chain, islice
from operator import is_, itemgetter
from typing import Any

REDACTED = "***"

_SECRET_KEY_RE = re.compile(
    r"(?:^|_|-|\.)(?:api_?key|key|token|secret|password|passwd|passphrase|pwd|credentials?|auth|authorization|cookie|private_?key)s?(?:$|_|-)"
    r"|(?:^|_|-|\.)pass$",  # "pass" only as the last word ("db_pass"; not "forward_pass_metrics")
    re.IGNORECASE,
)
# Keys that merely contain "key"/"token" but are not secrets (sizes, counts, flags).
_NOT_SECRET = re.compile(
    r"(?:tokens?_(?:size|len|num|ratio|usage|budget|per|limit|buckets?|id|map|interval)|(?:max|min|num|total|chunk|prefill|new|cached|pending|draft|page|context|used|prompt|generation|output|input)_.*token|token_?(?:izer|s_total|_usage)|^(?:skip_tokenizer_init|tokenizer.*|bucket_.*|key_?(?:s|value)?_?(?:dtype|layout)|.*_keys_active|kv_.*)$)",
    re.IGNORECASE,
)
_CAMEL_RE = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")

# scheme://USERINFO@ — the userinfo runs to the LAST "@" before the authority ends (/ ? # whitespace,
# a quote or a backslash of an escaped quote), so a password holding "@" is hidden whole
_URL_CRED_RE = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<cred>[^\s/?#'\"<>\\]*)@(?=[^\s@]|$)")
# user:pass@host without a scheme (the user may be empty: ":pass@host")
# scheme://user:pa/ss@host: a userinfo whose password holds a raw "/" (not a port: digits then "/")
_URL_SLASH_CRED_RE = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<cred>[^\s/?#'\"<>\\:@]*:(?!\d*/)[^\s'\"<>\\@]*/[^\s'\"<>\\@]*)@(?=[\w\[])")
# an Azure SAS (or any signed URL's) signature in a query string
_SIG_RE = re.compile(r"(?P<k>[?&;]sig=)(?P<v>[^&\s'\"#<>\\]+)", re.IGNORECASE)
_BARE_CRED_RE = re.compile(r"(?<![\w.%+:/@-])(?P<cred>[\w.%+~-]*:[^\s/?#'\"<>\\:]+(?:@[^\s/?#'\"<>\\:]+)*)@(?=[\w\[])")
_CLI_SECRET_RE = re.compile(
    r"(--(?:admin-)?api-key|--[\w-]*(?:token|secret|password|passwd|passphrase|credential)[\w-]*)(=|\s+)('[^'\n]*'|\"[^\"\n]*\"|\S+)", re.IGNORECASE
)
_AUTH_SCHEME = r"(?:bearer|basic|digest|token|negotiate|apikey)\s+"
_INLINE_SECRET_RE = re.compile(
    r"""(?P<k>[\w.-]*(?:key|secret|pass|pwd|token|credential|auth|cookie)[\w-]*)(?P<q>\\*["']?)(?P<sep>\s*[=:]\s*)"""
    r"""(?P<v>(?:""" + _AUTH_SCHEME + r""")?(?:\\*'(?:(?!\\*').)*\\*'|\\*"(?:(?!\\*").)*\\*"|[^,\s)}\]\\'"]+))""",
    re.IGNORECASE,
)
# quoted dict keys with a string value, as in the ``server_args={'api_key': '…'}`` log line, and JSON
# keys, also when the JSON sits escaped inside a string (``{\"token\": \"x\"}``)
_QUOTED_KV_RE = re.compile(r"""(?P<q>\\*['"])(?P<k>[\w.-]+)(?P=q)(?P<sep>\s*:\s*)(?P<vq>\\*['"])(?P<v>(?:(?!(?P=vq)).)*)(?P=vq)""")
_BEARER_RE = re.compile(r"\b(bearer)(\s+)([A-Za-z0-9._~+/=-]+)", re.IGNORECASE)
_NUMBER_RE = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")
_KEEP_VALUES = frozenset(("None", "null", "''", '""', "True", "False", "true", "false", "***", "'***'", '"***"'))


def is_secret_key(key: str) -> bool:
    return _is_secret_key(str(key))


@lru_cache(maxsize=4096)  # the same few hundred server-args keys are asked about on every redaction
def _is_secret_key(k: str) -> bool:
    # camelCase keys (clientSecret, accessKey) are read as snake_case
    if not k.islower():
        k = _CAMEL_RE.sub("_", k)
    # the cheap test first: _NOT_SECRET (leading-wildcard alternatives) costs ~10x more per key and only
    # matters for the few keys _SECRET_KEY_RE flags (a server_args line has ~550 keys; start-up time)
    return bool(_SECRET_KEY_RE.search(k)) and not _NOT_SECRET.search(k)


# Every text the patterns below can change holds an "@" (URL credentials) or one of these words (each
# secret-key pattern, each name is_secret_key accepts and the bearer pattern contain one): the rest is
# returned as it is, with one search instead of six substitutions (a server_args line has ~550 values).
_HINT_WORDS = ("key", "token", "secret", "pass", "pwd", "credential", "auth", "cookie", "bearer", "sig=")
_HINT_RE = re.compile("|".join(map(re.escape, _HINT_WORDS)), re.IGNORECASE)
# Besides its two cases, IGNORECASE matches an ASCII letter to these (and U+0130 lower-cases to two characters):
# a text without them holds a word of _HINT_RE exactly when its lower-cased text does (tests/test_redact.py)
_CASE_ODD = ("\u0130", "\u0131", "\u017f", "\u212a")


def _hinted(text: str) -> bool:
    """``_HINT_RE.search(text)``, found with ``in`` on the lower-cased text (about 8x faster)."""
    if not text.isascii() and any(c in text for c in _CASE_ODD):
        return _HINT_RE.search(text) is not None
    t = text.lower()
    return any(w in t for w in _HINT_WORDS)


# A narrower superset for line-based text (expositions, log lines), tested on lower-cased lines: a word of
# _HINT_RE must be followed by what its pattern needs ("=" or ":" soon after, a quote, whitespace and a
# value for a flag or "bearer"). Used by :func:`redact_lines`; tests prove it changes nothing.
REDACT_CANDIDATE = re.compile(
    r"@|sig=|--[\w-]*(?:api-key|token|secret|pass|credential)|bearer\s"
    r"|(?:key|secret|pass|pwd|token|credential|auth|cookie)[\w.-]*\\*['\"]?\s*[=:]"
)


_SURROGATE_RE = re.compile("[\ud800-\udfff]")
MAX_DEPTH = 64
TOO_DEEP = f"(nested deeper than {MAX_DEPTH} levels: not kept)"


def no_surrogates(text: str) -> str:
    """``text`` with lone surrogates (which no output can encode) replaced by U+FFFD."""
    if text.isascii():
        return text
    return _SURROGATE_RE.sub("\ufffd", text)


def redact_text(text: str) -> str:
    """Redact URL credentials, ``--api-key X`` pairs, bearer tokens and ``api_key='x'`` assignments (also
    inside JSON held in the text) in free text."""
    if not text:
        return text
    if len(text) <= _SHORT:
        return _redact_short(text)
    text = no_surrogates(text)
    if "@" not in text and not _hinted(text):
        return text
    return _redact_text(text)


_SHORT = 400  # texts this short are redacted once each (remembered): a report repeats its keys and sources


@lru_cache(maxsize=1 << 15)  # pure: a fleet report holds each key and evidence source ("prometheus@T q") per target
def _redact_short(text: str) -> str:
    text = no_surrogates(text)
    if not text or ("@" not in text and not _hinted(text)):
        return text
    return _redact_text(text)


# What a match of each pattern below must contain (a cheap test first: a pattern that cannot match leaves the
# text as it is). _INLINE_SECRET_RE's own scan is slow on text with words and colons (its key may start
# anywhere in a word): its key word, then [\w-]*, a quote and "=" or ":" (as REDACT_CANDIDATE)
_INLINE_HINT = re.compile(r"(?:key|secret|pass|pwd|token|credential|auth|cookie)[\w-]*\\*[\"']?\s*[=:]", re.IGNORECASE)
_QUOTED_HINT = re.compile(r"['\"]\s*:")  # _QUOTED_KV_RE: the key's closing quote, then ":"
_BEARER_HINT = re.compile("bearer", re.IGNORECASE)


def _redact_text(text: str) -> str:
    """Every pattern, each one only where it can match (tests/test_redact.py: the same as running each)."""
    if "@" in text and "/" in text:
        text = _URL_SLASH_CRED_RE.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    if "sig=" in text or "SIG=" in text.upper():
        text = _SIG_RE.sub(lambda m: m.group("k") + REDACTED, text)
    if "@" in text:
        text = _URL_CRED_RE.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    if "@" in text:
        text = _BARE_CRED_RE.sub(lambda m: f"{REDACTED}@" if m.group("cred") != REDACTED else m.group(0), text)

    def _cli(m: re.Match[str]) -> str:
        if not is_secret_key(m.group(1).lstrip("-").replace("-", "_")) or _NUMBER_RE.match(m.group(3)) or m.group(3) == REDACTED:
            return m.group(0)
        return f"{m.group(1)}{m.group(2)}{REDACTED}"

    if "--" in text:
        text = _CLI_SECRET_RE.sub(_cli, text)

    def _quoted(m: re.Match[str]) -> str:
        if not is_secret_key(m.group("k")) or not m.group("v") or m.group("v") == REDACTED:
            return m.group(0)
        vq = m.group("vq")
        return f"{m.group('q')}{m.group('k')}{m.group('q')}{m.group('sep')}{vq}{REDACTED}{vq}"

    if _QUOTED_HINT.search(text):
        text = _QUOTED_KV_RE.sub(_quoted, text)

    def _inline(m: re.Match[str]) -> str:
        if not is_secret_key(m.group("k")):
            return m.group(0)
        val = m.group("v")
        bare = val.strip("\\\"'")
        if val in _KEEP_VALUES or bare in _KEEP_VALUES or not bare or _NUMBER_RE.match(val):
            return m.group(0)
        lead = re.match(r"\\*[\"']", val)
        quote = lead.group(0) if lead else ""
        return f"{m.group('k')}{m.group('q')}{m.group('sep')}{quote}{REDACTED}{quote}"

    if _INLINE_HINT.search(text):
        text = _INLINE_SECRET_RE.sub(_inline, text)
    if not _BEARER_HINT.search(text):
        return text
    return _BEARER_RE.sub(lambda m: m.group(0) if m.group(3) == REDACTED else f"{m.group(1)}{m.group(2)}{REDACTED}", text)


def redact_lines(text: str) -> str:
    """:func:`redact_text` for line-based text (expositions, logs): only the lines that can hold a secret
    (:data:`REDACT_CANDIDATE`) pay for the patterns — the same result as on every line, ~10x faster on a
    typical SGLang exposition."""
    if not REDACT_CANDIDATE.search(text.lower()):
        return text
    return "".join(redact_text(ln) if REDACT_CANDIDATE.search(ln.lower()) else ln for ln in text.splitlines(keepends=True))


def _json_in_string(text: str) -> Any:
    """The value of a string that holds a JSON object or array, else None."""
    s = text.strip()
    if len(s) < 2 or s[0] not in "{[" or s[-1] not in "}]":
        return None
    import json  # only here: the --once --log start-up path never needs it (tests/test_startup.py)

    try:
        v = json.loads(s)
    except (ValueError, RecursionError):
        return None
    return v if isinstance(v, dict | list) else None


def redact_string(text: str, depth: int = 0) -> str:
    """A string value: JSON held in it is redacted as JSON (any depth), the rest as free text."""
    if len(text) <= _SHORT and text.lstrip()[:1] not in ("{", "["):
        return _redact_short(text)  # (no JSON in it: the same as redact_text)
    text = no_surrogates(text)
    if "@" not in text and not _hinted(text):
        return text
    inner = _json_in_string(text)
    if inner is not None:
        out = redact(inner, depth)
        if out != inner:
            import json

            return json.dumps(out, ensure_ascii=False)
    return _redact_text(text)


def redact_key(key: Any) -> Any:
    """A dict key as :func:`redact_strings` gives it: a string redacted as text, anything else as it is."""
    return redact_text(key) if isinstance(key, str) else key


def redact_value(key: str, value: Any, depth: int = 0) -> Any:
    """Redact the value of a secret-named key. Only text can hold a secret: numbers and booleans under a
    key such as ``token_capacity`` are kept (they are sizes, not credentials)."""
    if is_secret_key(key):
        if isinstance(value, str):
            return REDACTED if value else value
        if isinstance(value, dict | list | tuple) and depth >= MAX_DEPTH:
            return TOO_DEEP
        if isinstance(value, dict):
            return {no_surrogates(k) if isinstance(k, str) else k: redact_value(key, v, depth + 1) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [redact_value(key, v, depth + 1) for v in value]
        if isinstance(value, bytes):
            return REDACTED
        return value
    return redact(value, depth)


_PLAIN = frozenset((int, float, bool, type(None)))


def redact_strings(obj: Any, depth: int = 0) -> Any:
    """Deep-copy ``obj`` with every string (and dict key) redacted as text, and nothing replaced because
    of its key's name: the output doors use this on diagnoser's own documents, whose keys are its own
    schema ("key", "tokens"), while the values that came from a server were redacted by name on the way
    in (:func:`redact`).

    One walk, with each distinct short string redacted once (a fleet report of 10,000 targets holds
    about 2 million strings, most of them repeated keys and evidence sources): the same result as
    applying :func:`redact_string` to every string and :func:`redact_text` to every key
    (tests/test_redact.py compares it with that plain walk)."""
    return _Walk(share=False).any(obj, depth)


def redact_owned(obj: Any, depth: int = 0) -> Any:
    """:func:`redact_strings` of a document its caller has just built and owns whole (no part of it is
    referenced from anywhere else): the same value, but a container in which nothing changes is returned as
    it is instead of copied (the report of a 10,000-target fleet, whose strings are all clean, is not copied)."""
    return _Walk(share=True).any(obj, depth)


_PLAIN_STR = _PLAIN | {str}
_SAME: Any = object()  # a walk's memo of a string (or key) that redaction leaves as it is
# a list or dict this long is redacted column by column (:meth:`_Walk.column`): a fleet report holds lists of
# thousands of records of one shape (findings, checked rules, per-target tables)
_BULK = 16


class _Walk:
    """One :func:`redact_strings` (or :func:`redact_owned`: ``share``) walk. Small containers are walked item
    by item; long ones column by column: the values of all the records of a list that have a key are redacted
    together (each distinct string once) and the records rebuilt by copying each and writing only the values
    that change. Both give what the plain walk gives (tests/test_redact.py)."""

    __slots__ = ("keys", "values", "share")

    def __init__(self, share: bool) -> None:
        self.keys: dict[str, Any] = {}  # key -> its redaction, or _SAME
        self.values: dict[str, Any] = {}  # short string -> its redaction, or _SAME
        self.share = share

    def string(self, text: str, depth: int) -> str:
        """``redact_string(text, depth)``: ``text`` itself when that equals it."""
        if len(text) > _SHORT or (text and (text[0] in "{[" or text[0].isspace())):  # may hold JSON: depth matters
            out = redact_string(text, depth)
            return text if out == text else out
        out = self.values.get(text)
        if out is None:
            out = redact_string(text, depth)
            out = self.values[text] = _SAME if out == text else out
        return text if out is _SAME else out

    def key(self, k: Any) -> Any:
        """A key redacted as text: ``k`` itself when that equals it."""
        if type(k) is str:
            kk = self.keys.get(k)
            if kk is None:
                kk = redact_text(k)
                kk = self.keys[k] = _SAME if kk == k else kk
            return k if kk is _SAME else kk
        return redact_text(k) if isinstance(k, str) else k

    def any(self, obj: Any, depth: int) -> Any:
        t = type(obj)
        if t is str:
            return self.string(obj, depth)
        if t is dict:
            return self.mapping(obj, depth)
        if t is list or t is tuple:
            return self.sequence(obj, depth)
        if isinstance(obj, str):
            return redact_string(obj, depth)
        if isinstance(obj, dict):
            return self.mapping(obj, depth)
        if isinstance(obj, list | tuple):
            return self.sequence(obj, depth)
        return obj

    def mapping(self, obj: dict[Any, Any], depth: int) -> Any:
        if depth >= MAX_DEPTH:
            return TOO_DEEP
        d = depth + 1
        same = self.share and type(obj) is dict
        if len(obj) >= _BULK:
            vals = list(obj.values())
            new = self.column(vals, d)
            keys = list(map(self.key, obj))
            if same and new is None and all(map(is_, keys, obj)):
                return obj
            return dict(zip(keys, vals if new is None else new, strict=True))
        out = {}
        for k, v in obj.items():
            kk = self.key(k)
            tv = type(v)
            if tv in _PLAIN:
                vv = v
            elif tv is str:
                vv = self.string(v, d)
            else:
                vv = self.any(v, d)
            out[kk] = vv
            if same and (vv is not v or kk is not k):
                same = False
        return obj if same else out

    def sequence(self, obj: list[Any] | tuple[Any, ...], depth: int) -> Any:
        if depth >= MAX_DEPTH:
            return TOO_DEEP
        d = depth + 1
        vals = list(obj)
        if len(obj) >= _BULK:
            new = self.column(vals, d)
        else:
            new = [v if type(v) in _PLAIN else self.string(v, d) if type(v) is str else self.any(v, d) for v in vals]
            if self.share and all(map(is_, new, vals)):
                new = None
        if new is None:
            return obj if self.share and type(obj) is list else vals
        return new

    def column(self, vals: list[Any], depth: int) -> list[Any] | None:
        """``vals`` (values at ``depth``) redacted: a new list, or None when each value is to be kept as it is
        (numbers and strings that do not change; when sharing, containers in which nothing changes)."""
        try:
            distinct = set(vals)  # (each string's hash is cached: cheaper than a census of every value's type)
        except TypeError:  # containers
            distinct = None
        if distinct is not None:
            new = self.scalars(distinct, depth)
            if new is not False:
                return None if new is None else [new.get(v, v) for v in vals]  # (no number equals a str)
        else:
            types = set(map(type, vals))
            if types == {dict}:
                return self.records(vals, depth)
            if types == {list}:
                return self.lists(vals, depth)
        out = [v if type(v) in _PLAIN else self.string(v, depth) if type(v) is str else self.any(v, depth) for v in vals]
        return None if self.share and all(map(is_, out, vals)) else out

    def scalars(self, distinct: set[Any], depth: int) -> dict[str, str] | None | bool:
        """For the distinct values of a column: None when each stays as it is, else {string: its redaction}
        for the strings that change; False when some value is not a number or an exact str. Equal values
        collapse in a set, but only equal values of these types (a str equals only a str, an int 1 a float
        1.0): all are of them, and a str stands for the strings equal to it."""
        if not set(map(type, distinct)) <= _PLAIN_STR:
            return False
        changed = {}
        for s in distinct:
            if type(s) is str:
                r = self.string(s, depth)
                if r is not s:
                    changed[s] = r
        return changed or None

    def records(self, rows: list[dict[Any, Any]], depth: int) -> list[Any] | None:
        """:meth:`mapping` of each of ``rows`` (dicts at ``depth``), column by column (None: when sharing,
        nothing changes in any)."""
        if depth >= MAX_DEPTH:
            return [TOO_DEEP] * len(rows)
        names = set().union(*rows)
        size = sum(map(len, rows))
        # rows of many different keys (each target's table of its signals): row by row
        if len(names) * len(rows) > 2 * size or any(type(k) is not str or self.key(k) is not k for k in names):
            out = [self.mapping(r, depth) for r in rows]
            return None if self.share and all(map(is_, out, rows)) else out
        d = depth + 1
        try:  # numbers and strings only (a table of rules checked): one census for all the columns
            distinct = set(chain.from_iterable(map(dict.values, rows)))
        except TypeError:
            distinct = None
        changes = []
        if distinct is None or self.scalars(distinct, d) is not None:
            full = size == len(names) * len(rows)  # every row has every key
            for k in names:
                at = None if full else [i for i, r in enumerate(rows) if k in r]
                new = self.column(list(map(itemgetter(k), rows if at is None else [rows[i] for i in at])), d)
                if new is not None:
                    changes.append((k, at, new))
        if not changes and self.share:
            return None
        out = list(map(dict.copy, rows))  # (each row keeps its order of keys: only values are written below)
        for k, at, new in changes:
            for i, v in zip(range(len(out)) if at is None else at, new, strict=True):
                out[i][k] = v
        return out

    def lists(self, col: list[list[Any]], depth: int) -> list[Any] | None:
        """:meth:`sequence` of each of ``col`` (lists at ``depth``), their items redacted together (None: when
        sharing, nothing changes in any)."""
        if depth >= MAX_DEPTH:
            return [TOO_DEEP] * len(col)
        new = self.column(list(chain.from_iterable(col)), depth + 1)
        if new is None:
            return None if self.share else list(map(list, col))
        items = iter(new)
        return [list(islice(items, len(c))) for c in col]


def redact(obj: Any, depth: int = 0) -> Any:
    """Deep-copy ``obj`` with secrets replaced. Strings are scanned for credentials (and for JSON they hold).
    Containers nested deeper than :data:`MAX_DEPTH` are replaced by :data:`TOO_DEEP`."""
    if isinstance(obj, dict | list | tuple) and depth >= MAX_DEPTH:
        return TOO_DEEP
    if isinstance(obj, dict):
        return {(redact_text(k) if isinstance(k, str) else k): redact_value(str(k), v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, list | tuple):  # numbers (a chart's thousands of points) are copied as they are
        return [v if type(v) in _PLAIN else redact(v, depth + 1) for v in obj]
    if isinstance(obj, str):
        return redact_string(obj, depth)
    return obj
