#!/bin/sh
# Rebuild the bundled examples from their sources (tests/test_replay_examples.py checks the result).
# Reads the real recordings under tests/data/ (each folder's README names its source).
set -e
cd "$(dirname "$0")/.."
D="tests/data"
DIAG="${DIAGNOSE:-.venv/bin/diagnose}"
"$DIAG" record --force --from "$D/sglang-cpu-real/kv-full-retract" --name kv-full-retract -o examples/kv-full-retract.dgb \
  --note "real SGLang 0.5.23 on CPU: tests/data/sglang-cpu-real/kv-full-retract (--max-total-tokens 2048, 40 clients)"
"$DIAG" record --force --from "$D/sglang-cpu-real/client-bound-low-occupancy" --name client-bound -o examples/client-bound.dgb \
  --note "real SGLang 0.5.23 on CPU: tests/data/sglang-cpu-real/client-bound-low-occupancy"
"$DIAG" record --force --from "$D/sglang-cpu-real/prefill-capped" --name prefill-capped -o examples/prefill-capped.dgb \
  --note "real SGLang 0.5.23 on CPU: tests/data/sglang-cpu-real/prefill-capped"
"$DIAG" record --force --from "$D/cases/012-sglang-11948-eagle3-low-accept-len" --name eagle3-low-accept -o examples/eagle3-low-accept.dgb \
  --note "real public log from sgl-project/sglang issue #11948 (tests/data/cases/012-sglang-11948-eagle3-low-accept-len), verbatim"
"$DIAG" record --force --from tests/cases/seed-kimi-k25 --name seed-kimi-k25 -o examples/seed-kimi-k25.dgb \
  --note "SYNTHETIC: written from the numbers of issue 4 (Kimi-K2.5, TP 8, pool 116,171 tokens); see tests/cases/seed-kimi-k25/source.md"
# the docker compose demo (deploy/demo/) plays the same recording
cp examples/kv-full-retract.dgb deploy/demo/kv-full-retract.dgb
cp examples/kv-full-retract.dgb diagnoser/examples/kv-full-retract.dgb  # diagnose demo, in the wheel
