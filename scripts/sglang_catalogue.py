#!/usr/bin/env python3
"""Build diagnoser's SGLang catalogue from SGLang's own releases (run by hand; it uses the package index).

    python3 scripts/sglang_catalogue.py [--cache DIR] [--workers 4] [--only 0.5.23 …]

For every sglang release on PyPI (``pip index versions sglang``) it runs ``pip download --no-deps
sglang==V`` into the cache directory (kept outside the repository; a release already there is not
downloaded again), opens the wheel or sdist without installing it, and extracts with :mod:`ast`, with
file and line:

* the log-message templates of the modules that log the server's state (``LOG_MODULES`` below):
  ``logger.info/warning/error/debug/exception/critical(...)`` calls, their f-string, ``%`` and
  ``.format`` templates, and messages built in a local variable (``msg = f"…"; msg += f"…"``);
* metric definitions (``Gauge``/``Counter``/``Histogram``/``Summary``: name, type, labels, buckets);
* every ``ServerArgs`` field (type, default) and the CLI spellings ``add_cli_args`` gives it;
* the keys of ``/server_info`` (``/get_server_info``).

Everything is deduplicated across releases: each template, metric, flag and key is stored once with the
release ranges where it exists, into ``diagnoser/engines/sglang/catalogue/`` (docs/catalogue.md).
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures as cf
import gzip
import io
import json
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "diagnoser" / "engines" / "sglang" / "catalogue"

# modules whose log lines state the server's state (paths under sglang/, every release's layout)
LOG_MODULES = re.compile(
    r"^srt/(?:"
    r"managers/(?:scheduler[^/]*|tp_worker[^/]*|tokenizer_manager[^/]*|cache_controller|schedule_batch|"
    r"scheduler_components/[^/]+|controller/[^/]+|router/(?:model_rpc|model_runner|manager|radix_cache)[^/]*)"
    r"|model_executor/(?:model_runner[^/]*|model_runner_components/[^/]+|[^/]*cuda_graph_runner|runner/[^/]+|"
    r"runner_backend/[^/]+)"
    r"|mem_cache/(?:memory_pool[^/]*|[^/]*allocator[^/]*|allocator/[^/]+|hiradix_cache|hicache[^/]*|swa_[^/]+|"
    r"hybrid_cache/[^/]+|unified_memory_pool|deepseek_v4_memory_pool|allocation|kv_cache_[^/]+)"
    r"|hardware_backend/[^/]+/graph_runner/[^/]+"
    r"|memory_pool"
    r"|disaggregation/(?!encoder/)(?:[^/]+|[^/]+/[^/]+)"
    r"|speculative/[^/]*(?:worker|cuda_graph_runner)[^/]*"
    r"|observability/[^/]*scheduler[^/]*"
    r"|entrypoints/http_server|server"
    r"|server_args|arg_groups/[^/]+"
    r")\.py$"
)
METRIC_MODULES = re.compile(r"^srt/(?!rust_server/).+\.py$")  # every srt module that imports prometheus_client
LEVELS = ("debug", "info", "warning", "warn", "error", "exception", "critical")
LOGGER_NAMES = {"logger", "logging", "log", "_logger", "LOGGER"}


# ---------------------------------------------------------------------------------------------- templates
def _ftype(expr: ast.AST | None, spec: str) -> str:
    """The type of a formatted value: from its format spec first, then from its name."""
    s = spec.rstrip()
    if s:
        if s[-1:] in "fFeEgG%":
            return "float"
        if s[-1:] in "dn" or s.endswith(",") or s.endswith("_"):
            return "int"
        if s[-1:] in "xXob":
            return "hex"
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name):
        if expr.func.id in ("len", "int", "sum"):
            return "int"
        if expr.func.id == "float":
            return "float"
        if expr.func.id == "round":
            return "float" if len(expr.args) > 1 else "int"
    if isinstance(expr, ast.Constant):
        return type(expr.value).__name__ if isinstance(expr.value, (int, float)) else "str"
    name = ast.unparse(expr) if expr is not None else ""
    low = name.lower()
    if re.search(r"(?:^|[._])(?:num|n)_|_(?:num|count|size|ct|len|idx|rank|id|bs|tokens|reqs)\b|#|len\(", low):
        return "int"
    if re.search(r"(?:usage|ratio|rate|throughput|gb|mem|time|elapsed|latency|fraction|seconds|_s)\b", low):
        return "float"
    return "any"


def _esc(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def _field(expr: ast.AST | None, spec: str, conv: int = -1) -> str:
    name = ast.unparse(expr) if expr is not None else ""
    name = re.sub(r"\s+", " ", name)[:80].replace("{", "(").replace("}", ")").replace(":", ";")
    t = "str" if conv in (114, 115) and not spec else _ftype(expr, spec)  # !r / !s without a spec
    return "{" + f"{name}:{t}" + "}"


def _joined(node: ast.JoinedStr) -> str:
    out = []
    for v in node.values:
        if isinstance(v, ast.Constant):
            out.append(_esc(str(v.value)))
        elif isinstance(v, ast.FormattedValue):
            spec = ""
            if v.format_spec is not None and isinstance(v.format_spec, ast.JoinedStr):
                spec = "".join(str(c.value) for c in v.format_spec.values if isinstance(c, ast.Constant))
            out.append(_field(v.value, spec, v.conversion))
    return "".join(out)


_PCT_RE = re.compile(r"%(?:\([^)]*\))?[-+ #0]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[hlL]?([diouxXeEfFgGcrsa%])")
_FMT_RE = re.compile(r"\{([^{}:!]*)(?:![rsa])?(?::([^{}]*))?\}")


def _percent(fmt: str, args: list[ast.AST]) -> str:
    out, pos, i = [], 0, 0
    for m in _PCT_RE.finditer(fmt):
        out.append(_esc(fmt[pos:m.start()]))
        pos = m.end()
        c = m.group(1)
        if c == "%":
            out.append("%")
            continue
        expr = args[i] if i < len(args) else None
        i += 1
        t = {"d": "int", "i": "int", "u": "int", "f": "float", "F": "float", "e": "float", "E": "float", "g": "float",
             "G": "float", "x": "hex", "X": "hex", "o": "int"}.get(c)
        if t is None:
            t = _ftype(expr, "") if expr is not None else "any"
            if t == "any" and c in "rsa":
                t = "str"
        name = ast.unparse(expr)[:80].replace("{", "(").replace("}", ")").replace(":", ";") if expr is not None else f"arg{i}"
        out.append("{" + f"{name}:{t}" + "}")
    out.append(_esc(fmt[pos:]))
    return "".join(out)


def _dotformat(fmt: str, args: list[ast.AST], kwargs: dict[str, ast.AST]) -> str:
    out, pos, i = [], 0, 0
    text = fmt.replace("{{", "\0").replace("}}", "\1")
    for m in _FMT_RE.finditer(text):
        out.append(_esc(text[pos:m.start()].replace("\0", "{").replace("\1", "}")))
        pos = m.end()
        key, spec = m.group(1), m.group(2) or ""
        if key.isdigit():
            expr = args[int(key)] if int(key) < len(args) else None
        elif key:
            expr = kwargs.get(key)
        else:
            expr = args[i] if i < len(args) else None
            i += 1
        out.append(_field(expr, spec) if expr is not None else "{" + f"{key or 'arg'}:{_ftype(None, spec)}" + "}")
    out.append(_esc(text[pos:].replace("\0", "{").replace("\1", "}")))
    return "".join(out)


def _templates(node: ast.AST, env: dict[str, list[list[str]]], depth: int = 0) -> list[str]:
    """Every template string an expression can print (several for a conditional)."""
    if depth > 6:
        return ["{expr:any}"]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [_esc(node.value)]
    if isinstance(node, ast.JoinedStr):
        return [_joined(node)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _templates(node.left, env, depth + 1), _templates(node.right, env, depth + 1)
        return [a + b for a in left[:4] for b in right[:4]]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant) and isinstance(node.left.value, str):
        args = list(node.right.elts) if isinstance(node.right, ast.Tuple) else [node.right]
        return [_percent(node.left.value, args)]
    if isinstance(node, ast.IfExp):
        return _templates(node.body, env, depth + 1) + _templates(node.orelse, env, depth + 1)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format"
            and isinstance(node.func.value, ast.Constant) and isinstance(node.func.value.value, str)):
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        return [_dotformat(node.func.value.value, list(node.args), kw)]
    if isinstance(node, ast.Name) and node.id in env:
        # a message built in a local: its first assignment, then each += piece (optional: it may be in an if)
        out = []
        for pieces in env[node.id][:3]:
            out.append("".join(p if k == 0 else "\2" + p + "\3" for k, p in enumerate(pieces)))
        return out
    return ["{" + re.sub(r"\s+", " ", ast.unparse(node))[:80].replace("{", "(").replace("}", ")").replace(":", ";") + ":any}"]


class _LogVisitor(ast.NodeVisitor):
    def __init__(self, path: str) -> None:
        self.path = path
        self.out: list[dict[str, Any]] = []
        self.envs: list[dict[str, list[list[str]]]] = [{}]

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        env: dict[str, list[list[str]]] = {}
        for sub in ast.walk(node):  # string locals and their += pieces, in source order
            if isinstance(sub, ast.Assign) and len(sub.targets) == 1 and isinstance(sub.targets[0], ast.Name):
                if isinstance(sub.value, (ast.JoinedStr, ast.Constant, ast.BinOp)):
                    t = _templates(sub.value, {}, 1)
                    if t and not t[0].startswith("{") or (isinstance(sub.value, ast.JoinedStr)):
                        env.setdefault(sub.targets[0].id, []).append([t[0]])
            elif isinstance(sub, ast.AugAssign) and isinstance(sub.op, ast.Add) and isinstance(sub.target, ast.Name):
                if sub.target.id in env and isinstance(sub.value, (ast.JoinedStr, ast.Constant, ast.BinOp)):
                    env[sub.target.id][-1].append(_templates(sub.value, {}, 1)[0])
        self.envs.append(env)
        self.generic_visit(node)
        self.envs.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if (isinstance(f, ast.Attribute) and f.attr in LEVELS and node.args
                and (isinstance(f.value, ast.Name) and f.value.id in LOGGER_NAMES
                     or isinstance(f.value, ast.Attribute) and f.value.attr in LOGGER_NAMES)):
            level = {"warn": "warning", "exception": "error", "critical": "error"}.get(f.attr, f.attr)
            first = node.args[0]
            if len(node.args) > 1 and isinstance(first, ast.Constant) and isinstance(first.value, str):
                temps = [_percent(first.value, list(node.args[1:]))]
            else:
                temps = _templates(first, self.envs[-1])
            for t in dict.fromkeys(temps):
                self.out.append({"file": self.path, "line": node.lineno, "level": level, "template": t})
        self.generic_visit(node)


# ------------------------------------------------------------------------------------------------ metrics
_METRIC_TYPES = {"Gauge": "gauge", "Counter": "counter", "Histogram": "histogram", "Summary": "summary"}


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (set, frozenset)):
        return sorted((_jsonable(x) for x in v), key=str)
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return "<" + repr(v)[:120] + ">"


def _literal(node: ast.AST | None) -> Any:
    if node is None:
        return None
    try:
        return _jsonable(ast.literal_eval(node))
    except Exception:
        return "<" + re.sub(r"\s+", " ", ast.unparse(node))[:120] + ">"


def _metrics(tree: ast.AST, path: str) -> list[dict[str, Any]]:
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fname = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id if isinstance(node.func, ast.Name) else ""
        if fname not in _METRIC_TYPES:
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        name_node = kw.get("name") or (node.args[0] if node.args else None)
        if name_node is None:
            continue
        names = _templates(name_node, {})
        for name in names:
            name = name.replace("{{", "{").replace("}}", "}")
            if "sglang" not in name:  # a name built at run time, or collections.Counter(...): not listed
                continue
            labels = _literal(kw.get("labelnames") or (node.args[2] if len(node.args) > 2 else None))
            out.append({"name": name, "type": _METRIC_TYPES[fname], "labels": labels,
                        "buckets": _literal(kw.get("buckets")), "file": path, "line": node.lineno})
    return out


# -------------------------------------------------------------------------------------------- server args
def _server_args(tree: ast.AST, path: str, fields: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """``ServerArgs`` fields: the dataclass of server_args.py (to 0.5.2x) or, in the newer layout, the
    namespaces of ``arg_groups/fields/*.py`` whose fields are ``A[T, help]`` / ``A[T, Arg(...)]``; their
    CLI spelling is ``--field-name`` unless ``Arg(cli_name=…, aliases=…, no_cli=True)`` says otherwise.
    ``add_argument`` calls (the older layout, and the newer one's deprecated flags) add spellings."""
    fields = {} if fields is None else fields
    namespaced = "/arg_groups/fields/" in path
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and (node.name == "ServerArgs" or namespaced):
            for st in node.body:
                if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)) or st.target.id.startswith("_"):
                    continue
                d = _literal(st.value)
                if isinstance(st.value, ast.Call) and "field" in ast.unparse(st.value.func):
                    kw = {k.arg: k.value for k in st.value.keywords}
                    d = _literal(kw.get("default")) if "default" in kw else "<factory>"
                ann, cli = st.annotation, []
                typ = ast.unparse(ann)
                if isinstance(ann, ast.Subscript) and isinstance(ann.value, ast.Name) and ann.value.id == "A":
                    elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
                    typ = ast.unparse(elts[0])
                    meta = elts[1] if len(elts) > 1 else None
                    akw = ({k.arg: k.value for k in meta.keywords if k.arg}
                           if isinstance(meta, ast.Call) and ast.unparse(meta.func) in ("Arg", "Derived") else {})
                    if isinstance(meta, ast.Call) and ast.unparse(meta.func) == "Derived" or _literal(akw.get("no_cli")) is True:
                        cli = []
                    else:
                        name = _literal(akw.get("cli_name")) if "cli_name" in akw else None
                        main = name if isinstance(name, str) else "--" + st.target.id.replace("_", "-")
                        cli = [{"flag": main if main.startswith("-") else "--" + main, "action": "", "deprecated": False}]
                        aliases = _literal(akw.get("aliases"))
                        for al in aliases if isinstance(aliases, list) else []:
                            cli.append({"flag": al if al.startswith("-") else "--" + al, "action": "alias", "deprecated": False})
                elif node.name == "ServerArgs":
                    cli = []
                else:
                    continue
                fields[st.target.id] = {"field": st.target.id, "type": typ, "default": d,
                                        "cli": cli, "file": path, "line": st.lineno}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            opts = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if not opts or not opts[0].startswith("-"):
                continue
            kw = {k.arg: k.value for k in node.keywords if k.arg}
            dest = _literal(kw["dest"]) if "dest" in kw else max(opts, key=len).lstrip("-").replace("-", "_")
            action = ast.unparse(kw["action"]) if "action" in kw else ""
            helptext = ast.unparse(kw["help"]) if "help" in kw else ""
            deprecated = "Deprecated" in action or "deprecated" in helptext.lower()[:200]
            rec = fields.get(dest) if isinstance(dest, str) else None
            if rec is None:
                rec = fields.setdefault(f"<cli>{dest}", {"field": None, "type": None, "default": None, "cli": [],
                                                          "file": path, "line": node.lineno})
            for o in opts:
                if o.startswith("--") and o not in [c["flag"] for c in rec["cli"]]:
                    rec["cli"].append({"flag": o, "action": action.split(".")[-1][:40], "deprecated": deprecated})
    return list(fields.values())


def _server_info_keys(tree: ast.AST, path: str) -> list[dict[str, Any]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in (
                "get_server_info", "server_info", "get_server_args", "build_server_info"):
            for sub in ast.walk(node):
                if isinstance(sub, ast.Assign) and isinstance(sub.targets[0], ast.Subscript):
                    k = sub.targets[0].slice
                    if isinstance(k, ast.Constant) and isinstance(k.value, str):
                        out.append({"key": k.value, "file": path, "line": sub.lineno})
                elif (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == "update"
                      and sub.args):
                    out.append({"key": "**" + ast.unparse(sub.args[0])[:80], "file": path, "line": sub.lineno})
                elif isinstance(sub, ast.Dict):
                    for k, v in zip(sub.keys, sub.values, strict=False):
                        key = k.value if isinstance(k, ast.Constant) and isinstance(k.value, str) else "**" + ast.unparse(v)[:80]
                        out.append({"key": key, "file": path, "line": sub.lineno})
    return out


# ------------------------------------------------------------------------------------------------ reading
def _sources(archive: Path) -> dict[str, bytes]:
    """The .py files under ``sglang/`` of a wheel or sdist, keyed by their path below ``sglang/``."""
    out: dict[str, bytes] = {}

    def keep(name: str) -> str | None:
        i = name.find("sglang/")
        if i < 0 or not name.endswith(".py"):
            return None
        rel = name[i + len("sglang/"):]
        return rel if rel.startswith("srt/") or rel in ("version.py",) else None

    if archive.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(archive) as z:
            for n in z.namelist():
                if (rel := keep(n)) is not None:
                    out.setdefault(rel, z.read(n))
    else:
        with tarfile.open(archive) as t:
            for m in t.getmembers():
                if m.isfile() and (rel := keep(m.name)) is not None:
                    f = t.extractfile(m)
                    if f is not None:
                        out.setdefault(rel, f.read())
    return out


def extract(version: str, archive: Path) -> dict[str, Any]:
    logs: list[dict[str, Any]] = []
    metrics: list[dict[str, Any]] = []
    args: list[dict[str, Any]] = []
    info: list[dict[str, Any]] = []
    arg_fields: dict[str, dict[str, Any]] = {}
    srcs = _sources(archive)
    # the namespaces first, so that add_argument calls anywhere add spellings to their fields
    for rel, data in sorted(srcs.items(), key=lambda kv: (not kv[0].startswith("srt/arg_groups/fields/"), kv[0])):
        want_log, want_metric = LOG_MODULES.match(rel), METRIC_MODULES.match(rel) and b"prometheus" in data
        want_args = rel == "srt/server_args.py" or rel.startswith("srt/arg_groups/")
        want_info = rel in ("srt/entrypoints/http_server.py", "srt/server.py", "srt/utils/common.py", "srt/utils.py")
        if not (want_log or want_metric or want_args or want_info):
            continue
        try:
            tree = ast.parse(data.decode("utf-8", "replace"))
        except SyntaxError:
            continue
        path = "sglang/" + rel
        if want_log:
            v = _LogVisitor(path)
            v.visit(tree)
            logs.extend(v.out)
        if want_metric:
            metrics.extend(_metrics(tree, path))
        if want_args:
            _server_args(tree, path, arg_fields)
        if want_info:
            info.extend(_server_info_keys(tree, path))
    args = list(arg_fields.values())
    return {"version": version, "logs": logs, "metrics": metrics, "server_args": args, "server_info": info}


# ---------------------------------------------------------------------------------------------- releases
def _vkey(v: str) -> tuple[int, ...]:
    m = re.match(r"(\d+)\.(\d+)\.(\d+)(?:\.post(\d+))?", v)
    return tuple(int(x or 0) for x in m.groups()) if m else (0,)


def releases() -> list[str]:
    r = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "sglang", "--disable-pip-version-check"],
                       capture_output=True, text=True, check=True)
    m = re.search(r"Available versions:\s*(.+)", r.stdout)
    if not m:
        raise SystemExit("pip index versions sglang printed no version list")
    vs = [v.strip() for v in m.group(1).split(",") if re.fullmatch(r"\d+\.\d+\.\d+(?:\.post\d+)?", v.strip())]
    return sorted(vs, key=_vkey)


def download(version: str, cache: Path) -> Path | None:
    d = cache / version
    have = [p for p in d.glob("sglang-*") if p.suffix in (".whl", ".gz", ".zip")] if d.exists() else []
    if not have:
        d.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
                        f"sglang=={version}", "-d", str(d)], capture_output=True, check=False)
        have = [p for p in d.glob("sglang-*") if p.suffix in (".whl", ".gz", ".zip")]
    return sorted(have, key=lambda p: p.suffix != ".whl")[0] if have else None


# ------------------------------------------------------------------------------------------------- dedup
def _ranges(idx: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for i in sorted(set(idx)):
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return out


def merge(per_release: list[dict[str, Any]], vers: list[str]) -> dict[str, Any]:
    pos = {v: i for i, v in enumerate(vers)}

    def fold(kind: str, key_of: Any, keep: Any) -> list[dict[str, Any]]:
        table: dict[Any, dict[str, Any]] = {}
        for rel in per_release:
            i = pos[rel["version"]]
            for item in rel[kind]:
                k = key_of(item)
                rec = table.get(k)
                if rec is None:
                    rec = table[k] = {**keep(item), "_idx": [], "at": {}}
                if i not in rec["_idx"]:
                    rec["_idx"].append(i)
                    rec["at"][vers[i]] = f"{item['file']}:{item['line']}"
        out = []
        for rec in table.values():
            idx = rec.pop("_idx")
            rng = _ranges(idx)
            # file:line at the first and last release of each range (the rest is the same code moved a little)
            at = {}
            for a, b in rng:
                at[vers[a]] = rec["at"][vers[a]]
                at[vers[b]] = rec["at"][vers[b]]
            rec["at"] = at
            rec["releases"] = rng
            out.append(rec)
        return out

    logs = fold("logs", lambda x: (x["file"], x["level"], x["template"]),
                lambda x: {"file": x["file"], "level": x["level"], "template": x["template"]})
    # a template moved between files keeps its id per file; ids are stable for a given catalogue build
    logs.sort(key=lambda r: (r["file"], r["releases"][0][0], r["template"]))
    for n, r in enumerate(logs):
        r["id"] = f"T{n:05d}"
    metrics = fold("metrics", lambda x: (x["name"], x["type"], json.dumps(x["labels"]), json.dumps(x["buckets"])),
                   lambda x: {"name": x["name"], "type": x["type"], "labels": x["labels"], "buckets": x["buckets"]})
    metrics.sort(key=lambda r: (r["name"], r["releases"][0][0]))
    args = fold("server_args",
                lambda x: (x["field"] or "", json.dumps(x["cli"]), x["type"] or "", json.dumps(x["default"], default=str)),
                lambda x: {"field": x["field"], "type": x["type"], "default": x["default"], "cli": x["cli"]})
    args.sort(key=lambda r: (r["field"] or "~" + r["cli"][0]["flag"] if r["cli"] else "~", r["releases"][0][0]))
    info = fold("server_info", lambda x: x["key"], lambda x: {"key": x["key"]})
    info.sort(key=lambda r: r["key"])
    return {"releases": vers, "templates": logs, "metrics": metrics, "server_args": args, "server_info": info}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "sglang-releases",
                    help="download cache, outside the repository (default ~/.cache/sglang-releases)")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--only", nargs="*", help="these releases only (a partial catalogue, for trying the extractor)")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    vers = a.only or releases()
    with cf.ThreadPoolExecutor(a.workers) as ex:
        archives = dict(zip(vers, ex.map(lambda v: download(v, a.cache), vers), strict=True))
    missing = [v for v, p in archives.items() if p is None]
    if missing:
        print(f"not downloaded (left out): {', '.join(missing)}", file=sys.stderr)
    vers = [v for v in vers if archives[v] is not None]
    with cf.ProcessPoolExecutor(max(1, min(a.workers, 2))) as ex:
        per = list(ex.map(extract, vers, [archives[v] for v in vers]))
    for p in per:
        print(f"{p['version']:>14}: {len(p['logs']):5d} log calls, {len(p['metrics']):4d} metrics, "
              f"{len(p['server_args']):4d} args, {len(p['server_info']):3d} info keys", file=sys.stderr)
    cat = merge(per, vers)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "releases.json").write_text(json.dumps(vers, indent=0) + "\n")
    for kind in ("templates", "metrics", "server_args", "server_info"):
        buf = io.BytesIO()
        with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
            gz.write(json.dumps(cat[kind], separators=(",", ":"), sort_keys=True, default=str).encode())
        (a.out / f"{kind}.json.gz").write_bytes(buf.getvalue())
        print(f"{kind}: {len(cat[kind])} entries, {len(buf.getvalue()) // 1024} KiB", file=sys.stderr)
    (a.out / "flags.tsv").write_text(flags_tsv(cat["server_args"]))
    return 0


def flags_tsv(args: list[dict[str, Any]]) -> str:
    """The CLI flags of every release as plain text (the suggestion checks read it without a JSON parser, off
    the start-up path): flag, field, deprecated (0/1), default (JSON), release ranges ``a-b,c-d``."""
    rows = ["# flag\tfield\tdeprecated\tdefault\treleases (generated by scripts/sglang_catalogue.py)"]
    for a in args:
        rng = ",".join(f"{x}-{y}" for x, y in a["releases"])
        for c in a["cli"]:
            default = json.dumps(a["default"], default=str).replace("\t", " ")
            rows.append(f"{c['flag']}\t{a['field'] or ''}\t{int(bool(c['deprecated']))}\t{default}\t{rng}")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
