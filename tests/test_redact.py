"""Secrets are redacted on ingestion, so no output can leak them: a real 0.5.23 /get_server_info payload
with secrets put where users put them goes through the config source and both report formats."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

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
