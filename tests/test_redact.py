"""Secrets are redacted on ingestion, so no output can leak them: a real 0.5.23 /get_server_info payload
with secrets put where users put them goes through the config source and both report formats."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from diagnoser.collect import collect_once
from diagnoser.engines.sglang import ADAPTER
from diagnoser.outputs.report import build
from diagnoser.outputs.text import render
from diagnoser.redact import REDACTED, is_secret_key, redact, redact_text
from diagnoser.sources.http import make_client
from tests.conftest import DATA

RUN = DATA / "sglang-cpu-real" / "prefill-capped"
SECRETS = ["sk-live-0123456789", "adm-9876543210", "hunter2", "hf_abcdefSECRET", "pw-in-url"]


@pytest.mark.parametrize("key", ["api_key", "admin_api_key", "hf_token", "HF_TOKEN", "ssl_keyfile_password",
                                 "aws_secret_access_key", "password", "auth_token", "x-api-key", "client_secret"])
def test_secret_names(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["token_usage", "max_total_tokens", "num_used_tokens", "tokenizer_path",
                                 "kv_cache_dtype", "bucket_time_to_first_token", "speculative_token_map",
                                 "tokenizer_metrics_custom_labels_header", "ssl_keyfile", "max_prefill_tokens"])
def test_not_secret_names(key: str) -> None:
    assert not is_secret_key(key)


def test_numbers_under_secret_looking_keys_are_kept() -> None:
    # real 0.5.23 field: internal_states[0].memory_usage.token_capacity is the KV pool size
    assert redact({"memory_usage": {"token_capacity": 65536}}) == {"memory_usage": {"token_capacity": 65536}}
    assert redact({"api_key": None, "admin_api_key": ""}) == {"api_key": None, "admin_api_key": ""}
    assert redact({"api_key": "sk-1", "tokens": ["a"], "hf_token": ["x", "y"]})["hf_token"] == [REDACTED, REDACTED]


def test_redact_text_forms() -> None:
    assert redact_text("redis://user:pw-in-url@cache:6379/0") == f"redis://{REDACTED}@cache:6379/0"
    assert "sk-1" not in redact_text("--model-path m --api-key sk-1 --port 30000")
    assert "sk-1" not in redact_text("--api-key=sk-1")
    assert "hf_x" not in redact_text("--hf-token hf_x --max-total-tokens 2048")
    assert "--max-total-tokens 2048 --max-prefill-tokens 128" in redact_text("--max-total-tokens 2048 --max-prefill-tokens 128")
    assert "sk-1" not in redact_text("ServerArgs(model_path='m', api_key='sk-1', port=30000)")
    assert redact_text("ServerArgs(api_key=None, port=1)") == "ServerArgs(api_key=None, port=1)"


def _payload() -> dict:
    info = json.loads((RUN / "get_server_info.json").read_text())
    info["api_key"] = SECRETS[0]
    info["admin_api_key"] = SECRETS[1]
    info["ssl_keyfile_password"] = SECRETS[2]
    info["launch_command"] += f" --api-key {SECRETS[0]} --admin-api-key {SECRETS[1]}"
    info["hicache_storage_backend_extra_config"] = json.dumps({"url": f"redis://u:{SECRETS[4]}@h:1", "token": SECRETS[3]})
    info["otlp_traces_endpoint"] = f"https://u:{SECRETS[4]}@otel:4318"
    info["internal_states"][0]["api_key"] = SECRETS[0]
    info["internal_states"][0]["hf_token"] = SECRETS[3]
    return info


def test_no_output_leaks_a_secret(data_dir: Path) -> None:
    payload = json.dumps(_payload()).encode()
    metrics = (RUN / "metrics_final.prom").read_bytes()

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/get_server_info":
            return httpx.Response(200, content=payload, headers={"content-type": "application/json"})
        if request.url.path == "/metrics":
            return httpx.Response(200, content=metrics)
        return httpx.Response(404)

    client = make_client(transport=httpx.MockTransport(handler))
    col = collect_once(ADAPTER, ["http://u:hunter2@127.0.0.1:30000"], [], duration=0, client=client)
    doc = build(col, SimpleNamespace(findings=[], errors=[]))
    outputs = [json.dumps(doc, default=str), render(doc, verbose=True), json.dumps(col.raw_config, default=str),
               repr([tl.config for tl in col.timelines])]
    for out in outputs:
        for secret in SECRETS:
            assert secret not in out
    cfg = doc["config"]["http://***@127.0.0.1:30000"]
    assert cfg["arg.api_key"]["value"] == REDACTED and cfg["arg.admin_api_key"]["value"] == REDACTED
    assert "--api-key ***" in cfg["arg.launch_command"]["value"]
    # redaction did not eat real numbers
    assert cfg["max_total_tokens"]["value"] == 65536 and cfg["chunked_prefill_size"]["value"] == 128


def test_redact_text_covers_quoted_dict_keys_for_every_output() -> None:
    """The quoted-key rule lives in redact_text itself (not only in bundles): a server_args dict line with
    a secret under a key the inline pattern does not name ('auth', 'session_cookie') is redacted too."""
    from diagnoser.redact import redact_text

    line = "server_args={'auth': 'Basic dXNlcjpwdw==', 'session_cookie': \"abc123\", 'tokenizer_path': 'm', 'page_size': 1}"
    out = redact_text(line)
    assert "dXNlcjpwdw" not in out and "abc123" not in out
    assert "'tokenizer_path': 'm'" in out and "'page_size': 1" in out


def test_quick_pass_changes_nothing_the_full_redaction_would(data_dir: Path) -> None:
    """redact_text returns a text without "@" or a secret-ish word as it is; the four substitutions
    (``_redact_text``) are the reference: same result on every line of the real logs, and on texts
    built from each secret form with the words' case and position varied."""
    from diagnoser.redact import _redact_text, redact_text

    texts: list[str] = []
    for log in sorted(data_dir.rglob("*.log")):
        texts += log.read_text(errors="replace").splitlines()
    forms = ["https://u:p@h/x", "--api-key s3cr3t", "--hf-token=abc", "api_key='x'", "{'Cookie': 'c'}",
             "'AUTHORIZATION': \"Bearer z\"", "PASSWD=hunter2", "{'db_pwd': 'x'}", "x Credentials: 'y'", "--admin-api-key k"]
    for f in forms:
        for t in (f, f.upper(), f.lower(), f"prefix {f} suffix", f"{f}, {f}"):
            texts.append(t)
    assert len(texts) > 5_000
    changed = 0
    for t in texts:
        full = _redact_text(t)
        assert redact_text(t) == full, t
        changed += full != t
    assert changed >= 40  # the forms above are redacted, so the comparison saw real substitutions


# -- issue 17: the shapes a probe found leaking, and their neighbours ---------------------------------

LEAK_SHAPES = [
    # (text, the secret that must go, what must stay)
    ("hicache_extra='Authorization: Bearer tok-unquoted-1'", "tok-unquoted-1", "hicache_extra="),
    ('{"otlp_headers": "Authorization: Bearer tok-json-2"}', "tok-json-2", '"otlp_headers"'),
    ("x-headers: authorization=Basic dXNlcjpwdy0z", "dXNlcjpwdy0z", "x-headers"),
    ("storage at redis://:pw-empty-user-4@cache:6379/0", "pw-empty-user-4", "@cache:6379/0"),
    ("storage at admin:pw-no-scheme-5@cache:6379", "pw-no-scheme-5", "@cache:6379"),
    (":pw-bare-6@10.0.0.1:6379", "pw-bare-6", "@10.0.0.1:6379"),
    ("--url http://:pw-url-7@127.0.0.1:30000", "pw-url-7", "@127.0.0.1:30000"),
    ("https://u:p@ss-at-8@host:443/x", "ss-at-8", "@host:443/x"),
    ("nohost:p@ss-bare-at-9@cache:1", "ss-bare-at-9", "@cache:1"),
    ("https://ghp_tokenonly10@github.com/o/r", "ghp_tokenonly10", "@github.com/o/r"),
    ("clientSecret=cs-camel-11 accessKey: 'ak-camel-12'", "cs-camel-11", "clientSecret="),
    ("curl -H 'Authorization: Bearer tok-13' http://h", "tok-13", "curl -H"),
]


@pytest.mark.parametrize("text, secret, kept", LEAK_SHAPES)
def test_every_leak_shape_is_redacted_and_idempotent(text: str, secret: str, kept: str) -> None:
    out = redact_text(text)
    assert secret not in out and REDACTED in out and kept in out, out
    assert redact_text(out) == out  # redacting at ingestion and again at output changes nothing more
    assert "ak-camel-12" not in redact_text(LEAK_SHAPES[10][0])


@pytest.mark.parametrize("text", [
    "scrape@2026-11-29T10:00:02Z sglang:num_queue_reqs", "server.log:1842", "user@host:22 (no password)",
    "Decode batch, #running-req: 12, #token: 2048, token usage: 0.50, gen throughput (token/s): 99.0, #queue-req: 3",
    "the basic block took 12 tokens", "ipv6 http://[::1]:30000/metrics", "max_total_tokens=65536, tokenizer_path='m'",
])
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert redact_text(text) == text


def test_secret_keys_at_any_depth_of_json_held_in_strings() -> None:
    inner = json.dumps({"backend": {"password": "deep-pw-1", "hosts": ["a"]}, "n": 3})
    doc = {"hicache_storage_backend_extra_config": json.dumps({"nested": inner, "token": "deep-tok-2"}),
           "argv": ["--x", json.dumps({"api_key": "deep-key-3"})], "page_size": 1}
    out = json.dumps(redact(doc))
    for s in ("deep-pw-1", "deep-tok-2", "deep-key-3"):
        assert s not in out
    red = redact(doc)
    nested = json.loads(json.loads(red["hicache_storage_backend_extra_config"])["nested"])
    assert red["page_size"] == 1 and nested == {"backend": {"password": REDACTED, "hosts": ["a"]}, "n": 3}
    # escaped JSON inside free text (a log line quoting a config string)
    line = 'extra_config="{\\"password\\": \\"deep-pw-4\\", \\"inner\\": {\\"token\\": \\"deep-tok-5\\"}}"'
    red = redact_text(line)
    assert "deep-pw-4" not in red and "deep-tok-5" not in red and '\\"password\\": \\"***\\"' in red


def test_dict_keys_are_redacted_too() -> None:
    assert redact({"http://u:pw-key-1@h:1": 1}) == {"http://***@h:1": 1}


def test_redact_lines_equals_redact_text_on_every_shape_and_real_line(data_dir: Path) -> None:
    """redact_lines only runs the patterns on candidate lines (REDACT_CANDIDATE): the same result as
    redact_text on every line, for the leak shapes (in any case) and for the real logs and expositions."""
    from diagnoser.redact import redact_lines

    texts = [t for t, _, _ in LEAK_SHAPES]
    texts += [t.upper() for t in texts] + [f"prefix {t} suffix" for t in texts]
    for f in sorted(data_dir.rglob("*.log"))[:20] + sorted(data_dir.rglob("*.prom"))[::25]:
        texts += f.read_text(errors="replace").splitlines()
    assert len(texts) > 2_000
    for t in texts:
        assert redact_lines(t) == redact_text(t), t


def test_output_doors_redact_text_but_keep_diagnosers_own_keys() -> None:
    """redact_strings (every output door) hides credentials in any string but leaves values under
    diagnoser's own schema keys alone ("key" is a fleet column's id, not a secret)."""
    from diagnoser.redact import redact_strings

    doc = {"headers": [{"key": "queue", "title": "queued"}], "tokens": "3 of 4", "source": "http://u:pw-door-1@h:1/x",
           "nested": [{"note": "--api-key sk-door-2 --port 1"}], "n": [1.5, None, 2]}
    out = redact_strings(doc)
    assert out["headers"] == [{"key": "queue", "title": "queued"}] and out["tokens"] == "3 of 4" and out["n"] == [1.5, None, 2]
    assert "pw-door-1" not in str(out) and "sk-door-2" not in str(out)


def test_issue26_secret_shapes() -> None:
    """The shapes issue 26's adversarial pass found leaking, through the one redaction path."""
    import json

    from diagnoser.redact import redact, redact_text

    cfg = json.dumps({"pass": "pp-s3cret-1", "passphrase": "pp-s3cret-2", "forward_pass_metrics_ipc_name": "ipc-kept"})
    out = redact({"hicache_storage_backend_extra_config": cfg})["hicache_storage_backend_extra_config"]
    assert "pp-s3cret" not in out and "ipc-kept" in out  # "pass" only as a key's last word
    assert "sas-s3cret" not in redact_text("https://a.blob.core.windows.net/c?sv=2022&sig=sas-s3cret%3D&se=1")
    assert redact_text("--api-key 'a s3cret' --port 1") == "--api-key *** --port 1"
    assert redact_text('--api-key "a b s3cret" --port 1') == "--api-key *** --port 1"
    assert redact_text("redis://admin:pw/sl4sh@cache:6379/0") == "redis://***@cache:6379/0"
    for kept in ("http://registry:4873/@scope/pkg", "see http://host/path@x", "http://host:8080/a@b"):
        assert redact_text(kept) == kept  # a port then "/" is not a password


def test_redaction_is_total_on_depth_and_surrogates() -> None:
    import json

    from diagnoser.redact import MAX_DEPTH, TOO_DEEP, redact, redact_strings

    deep: dict = {}
    node = deep
    for _ in range(5000):
        node["a"] = {}
        node = node["a"]
    node["api_key"] = "deep-s3cret"
    for f in (redact, redact_strings):
        out = f(deep)
        text = json.dumps(out)  # encodable, and never recursed past the cap
        assert "deep-s3cret" not in text and TOO_DEEP in text and text.count("{") == MAX_DEPTH
    assert redact({"m\ud800": "x\udc00y"}) == {"m\ufffd": "x\ufffdy"}
    assert redact_strings(["\ud800"]) == ["\ufffd"]


def test_total_json_loads() -> None:
    from diagnoser.jsonout import loads

    assert loads(b'{"a\\ud800": ["x\\udc00", {"b": "\\ud83d\\ude00"}], "c": "\xff"}') == {"a\ufffd": ["x\ufffd", {"b": "\U0001f600"}], "c": "\ufffd"}


def _redact_strings_plain(obj: Any, depth: int = 0) -> Any:
    """The reference for redact_strings: every string through redact_string, every key through redact_text,
    one call each, no memo (the walk before issue 26's fleet speed work)."""
    from diagnoser.redact import _PLAIN, MAX_DEPTH, TOO_DEEP, redact_string, redact_text

    if isinstance(obj, str):
        return redact_string(obj, depth)
    if isinstance(obj, dict | list | tuple) and depth >= MAX_DEPTH:
        return TOO_DEEP
    if isinstance(obj, dict):
        return {(redact_text(k) if isinstance(k, str) else k): (v if type(v) in _PLAIN else _redact_strings_plain(v, depth + 1))
                for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [v if type(v) in _PLAIN else _redact_strings_plain(v, depth + 1) for v in obj]
    return obj


def test_redact_strings_walk_equals_the_plain_walk(data_dir: Path) -> None:
    """The memoised walk gives exactly what the plain one does: on hostile strings repeated at different
    depths (JSON held in strings near the depth cap, keys that look like JSON, surrogates, str subclasses,
    tuples, non-string keys) and on a real report document."""
    import json

    from diagnoser.redact import MAX_DEPTH, redact_strings

    class S(str):
        pass

    secret_json = json.dumps({"api_key": "sk-walk-1", "inner": json.dumps({"token": "tk-walk-2"})})
    leaves = ["http://u:pw-walk-3@h:1/x", secret_json, " " + secret_json, "--api-key sk-walk-4 --port 1", "x\ud800y",
              S("--api-key sk-walk-5"), "prometheus@2026-12-01T00:00:00Z sglang:num_running_reqs", "", "{", "[1, 2]",
              "a" * 500 + " token=tk-walk-6", 1.5, None, True, 7]
    doc: Any = {"leaves": leaves, ("t", 1): leaves[:3], 3: "k", '{"api_key": "sk-key-7"}': 1, "api_key": "kept-by-text"}
    node = doc
    for d in range(MAX_DEPTH + 3):  # the same strings at every depth, up to past the cap
        node["down"] = {"d": d, "same": list(leaves), "tup": tuple(leaves[:4])}
        node = node["down"]
    assert redact_strings(doc) == _redact_strings_plain(doc)
    assert repr(redact_strings(doc)) == repr(_redact_strings_plain(doc))  # types too (a tuple becomes a list in both)
    metrics = (RUN / "metrics_final.prom").read_bytes()  # a real report and server info, secrets planted
    client = make_client(transport=httpx.MockTransport(lambda r: httpx.Response(200, content=metrics)))
    col = collect_once(ADAPTER, ["http://u:hunter2@127.0.0.1:30000"], [], duration=0, client=client)
    real = {"info": _payload(), "doc": build(col, SimpleNamespace(findings=[], errors=[])), "raw": col.raw_config}
    assert redact_strings(real) == _redact_strings_plain(real)


class _S(str):
    pass


def _containers(obj: Any, out: dict[int, Any] | None = None) -> dict[int, Any]:
    """Every list and dict in ``obj``, by id."""
    out = {} if out is None else out
    if isinstance(obj, dict | list) and id(obj) not in out:
        out[id(obj)] = obj
        for v in obj.values() if isinstance(obj, dict) else obj:
            _containers(v, out)
    return out


def _bulk_doc(seed: int) -> Any:
    """A document of long lists and dicts (redacted column by column) with hostile leaves in every place a
    column can hold them: records of one shape, of shapes that differ, sparse, with keys that redaction
    changes or that are not strings, nested records, lists of lists, mixed columns, tuples, str subclasses,
    JSON held in strings, surrogates, floats (-0.0, NaN, a float subclass), near and past the depth cap."""
    import random

    from diagnoser.floor import Floor
    from diagnoser.redact import MAX_DEPTH

    rng = random.Random(seed)
    secret_json = json.dumps({"api_key": "sk-bulk-1", "inner": json.dumps({"token": "tk-bulk-2"})})
    leaves = ["http://u:pw-bulk-3@h:1/x", secret_json, " " + secret_json, "--api-key sk-bulk-4 --port 1", "x\ud800y",
              _S("--api-key sk-bulk-5"), _S("plain"), "prometheus@2026-12-01T00:00:00Z sglang:num_running_reqs", "", "{",
              "[1, 2]", "a" * 500 + " token=tk-bulk-6", "Bearer tk-bulk-7", "fine", "fine too", 1.5, -0.0, float("nan"),
              Floor(100.0, 200.0), None, True, 7, ("t", "token=tk-bulk-8"), ["l", "pwd=pw-bulk-9"], {"d": "Bearer tk-bulk-10"}]
    clean = ["fine", "fine too", 1.5, -0.0, None, True, 7, "prometheus@2026-12-01T00:00:00Z q"]

    def leaf(hostile: float) -> Any:
        return rng.choice(leaves) if rng.random() < hostile else rng.choice(clean)

    def records(n: int, keys: list[Any], hostile: float, fill: float = 1.0) -> list[dict[Any, Any]]:
        return [{k: leaf(hostile) for k in keys if rng.random() < fill} for _ in range(n)]

    keys = ["rule", "target", "why", "status", "x"]
    doc: dict[Any, Any] = {
        "clean": records(40, keys, 0.0),
        "one": records(40, keys, 0.01),
        "many": records(40, keys, 0.3),
        "dense": records(40, keys, 0.2, fill=0.8),  # rows of different keys, most keys in most rows
        "sparse": [{f"k{i}_{j}": leaf(0.2) for j in range(3)} for i in range(40)],
        "odd keys": records(20, ["a", 3, None, 1.5], 0.2) + records(20, ["a", '{"api_key": "sk-key-11"}', "u:pw-key-12@h"], 0.2),
        "nested": [{"ev": records(rng.randint(0, 4), ["signal", "observed", "source"], 0.1),
                    "notes": [leaf(0.2) for _ in range(rng.randint(0, 3))], "basis": rng.choice([None, {"events": 1, "kind": leaf(0.3)}]),
                    "tup": tuple(leaf(0.2) for _ in range(2)), "sub": [[leaf(0.2)] for _ in range(2)]} for _ in range(40)],
        "lists": [[leaf(0.1) for _ in range(rng.randint(0, 5))] for _ in range(40)],
        "mixed": [rng.choice([leaf(0.2), {"a": leaf(0.2)}, [leaf(0.2)], None]) for _ in range(40)],
        "map": {f"t{i}": {"rule": leaf(0.05), "n": i} for i in range(40)},
        "big map keys": {rng.choice(["fine", "u:pw-key-13@h", f"k{i}"]) + str(i % 30): leaf(0.1) for i in range(40)},
    }
    node = doc
    for d in range(MAX_DEPTH + 2):  # long lists at every depth, up to past the cap
        node["down"] = {"d": d, "rows": records(20, keys, 0.1), "lists": [[leaf(0.1)] for _ in range(20)]}
        node = node["down"]
    return doc


@pytest.mark.parametrize("seed", range(8))
def test_column_walks_equal_the_plain_walk(seed: int) -> None:
    """redact_strings and redact_owned walk long lists column by column; both give what the plain walk gives
    (types too), redact_owned leaves its input as it was, and keeps what does not change as it is."""
    import copy

    from diagnoser.redact import _BULK, redact_owned, redact_strings

    doc = _bulk_doc(seed)
    assert len(doc["clean"]) >= _BULK
    before = repr(doc)
    want = _redact_strings_plain(doc)
    for walk in (redact_strings, redact_owned):
        got = walk(copy.deepcopy(doc) if walk is redact_owned else doc)
        assert got == want or repr(got) == repr(want)  # (NaN is not equal to itself: the reprs then)
        assert repr(got) == repr(want)
    assert repr(doc) == before
    owned = redact_owned(doc)
    assert repr(doc) == before  # (nothing written in place)
    assert owned["clean"] is doc["clean"] and owned["many"] is not doc["many"]
    copied = redact_strings(doc)
    assert not _containers(copied).keys() & _containers(doc).keys()  # a copy: no list or dict of the input in it
    text = json.dumps(owned)
    assert not any(f"{s}-bulk-{i}" in text for s in ("sk", "tk", "pw") for i in range(1, 11))


def test_redact_owned_returns_a_clean_document_as_it_is() -> None:
    from diagnoser.redact import redact_owned

    doc = {"rows": [{"rule": "kv", "why": f"read {i} readings", "n": i} for i in range(100)], "t": {"a": [1, 2, "x"]}}
    assert redact_owned(doc) is doc
    doc["rows"][50]["why"] = "http://u:pw-own-1@h"
    out = redact_owned(doc)
    assert out is not doc and out["t"] is doc["t"] and out["rows"][50]["why"] == "http://***@h"
    assert doc["rows"][50]["why"] == "http://u:pw-own-1@h"  # (the input as it was)


def _redact_text_every_pattern(text: str) -> str:
    """The reference for _redact_text: every pattern run on every text (before its cheap tests first)."""
    import re

    from diagnoser.redact import (
        _BARE_CRED_RE,
        _BEARER_RE,
        _CLI_SECRET_RE,
        _INLINE_SECRET_RE,
        _KEEP_VALUES,
        _NUMBER_RE,
        _QUOTED_KV_RE,
        _SIG_RE,
        _URL_CRED_RE,
        _URL_SLASH_CRED_RE,
    )

    if "@" in text and "/" in text:
        text = _URL_SLASH_CRED_RE.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    if "sig=" in text or "SIG=" in text.upper():
        text = _SIG_RE.sub(lambda m: m.group("k") + REDACTED, text)
    text = _URL_CRED_RE.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    if "@" in text:
        text = _BARE_CRED_RE.sub(lambda m: f"{REDACTED}@" if m.group("cred") != REDACTED else m.group(0), text)

    def _cli(m: re.Match[str]) -> str:
        if not is_secret_key(m.group(1).lstrip("-").replace("-", "_")) or _NUMBER_RE.match(m.group(3)) or m.group(3) == REDACTED:
            return m.group(0)
        return f"{m.group(1)}{m.group(2)}{REDACTED}"

    text = _CLI_SECRET_RE.sub(_cli, text)

    def _quoted(m: re.Match[str]) -> str:
        if not is_secret_key(m.group("k")) or not m.group("v") or m.group("v") == REDACTED:
            return m.group(0)
        vq = m.group("vq")
        return f"{m.group('q')}{m.group('k')}{m.group('q')}{m.group('sep')}{vq}{REDACTED}{vq}"

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

    text = _INLINE_SECRET_RE.sub(_inline, text)
    return _BEARER_RE.sub(lambda m: m.group(0) if m.group(3) == REDACTED else f"{m.group(1)}{m.group(2)}{REDACTED}", text)


def test_each_pattern_runs_only_where_it_can_match(data_dir: Path) -> None:
    """_redact_text tests what each pattern's match must hold before running it: the same result as running
    every pattern, on the leak shapes, the real logs and expositions, and 40,000 texts made of the pieces
    the patterns look for (key words in any case, quotes, escaped quotes, "=" and ":", "@", "//", "--",
    spaces and newlines)."""
    import random

    from diagnoser.redact import _redact_text

    texts = [t for t, _, _ in LEAK_SHAPES] + [t.upper() for t, _, _ in LEAK_SHAPES]
    for f in sorted(data_dir.rglob("*.log"))[:20] + sorted(data_dir.rglob("*.prom"))[::25]:
        texts += f.read_text(errors="replace").splitlines()
    pieces = ["api_key", "Token", "SECRET", "pass", "pwd", "credential", "Auth", "cookie", "key", "bearer ", "Bearer",
              "basic ", "sig=", "SIG=", "--", "--api-key", "--hf-token", "-", "=", ":", " : ", "'", '"', "\\", '\\"', "@",
              "://", "/", "http", "u", "pw", "x1", "***", "None", "12", " ", "  ", "\n", "{", "}", ",", "_", ".", "é", "ß"]
    rng = random.Random(26)
    texts += ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 14))) for _ in range(40_000)]
    keys, quotes, gaps = ["api_key", "Token", "db_pass", "page_size", "x.auth", "cookie-1"], ["'", '"', '\\"', "\\'", ""], ["", " ", "  ", "\n"]
    for _ in range(10_000):  # key-value shapes: quoted, inline, as flags, with a scheme word before the value
        q, q2, g1, g2 = rng.choice(quotes), rng.choice(quotes), rng.choice(gaps), rng.choice(gaps)
        kv = f"{q}{rng.choice(keys)}{q}{g1}{rng.choice([':', '='])}{g2}{q2}{rng.choice(['', 'Bearer ', 'basic '])}{rng.choice(['v-1', 'None', '12', '***', ''])}{q2}"
        texts.append(rng.choice(["", "x ", "{", "--api-key "]) + kv + rng.choice(["", ", ", "}", " tail"]))
    changed = 0
    for t in texts:
        want = _redact_text_every_pattern(t)
        assert _redact_text(t) == want, t
        changed += want != t
    assert changed > 5_000


def test_hinted_is_the_hint_pattern() -> None:
    """_hinted (lower-cased text and ``in``) answers what _HINT_RE.search does: checked on every code point
    against each letter of the hint words (what IGNORECASE matches to it is what lower-cases to it, but for
    the four odd ones, which send a text to the pattern), and on texts."""
    import random
    import re

    from diagnoser.redact import _CASE_ODD, _HINT_RE, _hinted

    every = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    assert [c for c in every if len(c.lower()) != 1] == ["\u0130"]  # lower() keeps every other position
    for letter in set("keytokensecretpasspwdcredentialauthcookiebearersig="):
        matched = set(re.findall(re.escape(letter), every, re.IGNORECASE))
        assert matched - set(_CASE_ODD) == {c for c in every if c.lower() == letter} - set(_CASE_ODD), letter
    rng = random.Random(5)
    pieces = ["KEY", "ToKeN", "sEcReT", "pa", "ss", "PWD", "credential", "AUTH", "cookie", "Bearer", "SIG=", "sig", "=", "é",
              "\u0130", "\u0131", "\u017f", "\u212a", "x", " ", "k", "s", "i", "\u212aey", "pa\u017fs", "cred\u0131ential", "auth"]
    for _ in range(20_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 6)))
        assert _hinted(text) == (_HINT_RE.search(text) is not None), text
