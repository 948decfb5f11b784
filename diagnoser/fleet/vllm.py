"""Fleet mode for vLLM targets: their series read back from Prometheus and judged by vLLM's own reader.

A Prometheus may hold SGLang and vLLM servers side by side. The SGLang targets are read by the query plan
(:mod:`diagnoser.fleet.queries`); the vLLM ones by this pass: one ``query_range`` over every vLLM series
diagnoser reads (``vllm[:_]NAME``, both spellings, V0 and V1 names: ``engines/vllm/metric_names.WANTED``),
at the pass's step. Each step of a target becomes one scrape's samples, fed in time order to the vLLM
adapter's ``ingest_samples``, so a Prometheus-fed vLLM timeline has the same signals, per-interval counter
rates and histogram quantiles as ``diagnose --once --url`` gives (docs/vllm.md#metrics). Targets are
``(job, instance, model_name)`` as for SGLang; V1's ``engine`` label (the data-parallel index) stays a rank
(``dp0``…). Each timeline says ``engine: vllm``, so the rules use vLLM's flags for it.
"""

from __future__ import annotations

import math
import re
from typing import Any

from diagnoser.engines.vllm import ADAPTER as VLLM
from diagnoser.engines.vllm.metric_names import WANTED
from diagnoser.fleet.promapi import PromAPI, PromError
from diagnoser.model import InputReport
from diagnoser.timeline import Timeline

MAX_TARGETS = 5000  # vLLM targets per pass (more are named as cut)
_DROP = ("__name__", "job", "instance")


def selector(matchers: str) -> str:
    names = "|".join(re.escape(n) for n in sorted(WANTED))
    return "{" + ", ".join([f'__name__=~"vllm[:_]({names})"'] + ([matchers] if matchers else [])) + "}"


def collect_vllm(api: PromAPI, matchers: str, start: float, end: float, step: float, rep: InputReport) -> tuple[list[Timeline], dict[str, Any]]:
    """The vLLM targets of the selected fleet as timelines, and their version ranges by target name."""
    try:
        result = api.query_range(selector(matchers), start, end, step)
    except PromError as e:
        rep.messages.append(f"The vLLM series could not be read ({e}); vLLM targets are left out of this pass.")
        return [], {}
    # target → time → samples; a series without model_name (none today) joins its instance's only model
    per: dict[tuple[str, str, str], dict[float, list[tuple[str, dict[str, str], float]]]] = {}
    spell: dict[tuple[str, str, str], set[str]] = {}
    models: dict[tuple[str, str], set[str]] = {}
    rows = [r for r in result if isinstance(r, dict) and isinstance(r.get("metric"), dict) and isinstance(r.get("values"), list)]
    rows.sort(key=lambda r: not r["metric"].get("model_name"))
    for r in rows:
        m = r["metric"]
        job, inst, model = str(m.get("job", "")), str(m.get("instance", "")), str(m.get("model_name", ""))
        if not model:
            same = models.get((job, inst), set())
            if len(same) != 1:
                continue
            model = next(iter(same))
        models.setdefault((job, inst), set()).add(model)
        key = (job, inst, model)
        if key not in per and len(per) >= MAX_TARGETS:
            continue
        full = str(m.get("__name__", ""))
        name = full[5:]
        spell.setdefault(key, set()).add(full[:5])
        labels = {k: str(v) for k, v in m.items() if k not in _DROP}
        by_t = per.setdefault(key, {})
        for pair in r["values"]:
            try:
                ts, val = float(pair[0]), float(pair[1])
            except (TypeError, ValueError, IndexError):
                continue
            if not math.isfinite(ts):
                continue
            by_t.setdefault(ts, []).append((name, labels, val))
    insts: dict[str, int] = {}
    for _job, inst, _model in per:
        insts[inst] = insts.get(inst, 0) + 1
    timelines: list[Timeline] = []
    versions: dict[str, Any] = {}
    for key in sorted(per):
        job, inst, model = key
        name = inst if insts[inst] == 1 else f"{inst} {model}"
        tl = Timeline(target=name)
        tl.engine = "vllm"
        tl.set_config("engine", "vllm", f"prometheus: the target's {sorted(spell.get(key, {'vllm:'}))[0]} series")
        if model:
            tl.set_config("served_model_name", model, "prometheus label model_name", override=False)
        tl.meta["labels"] = {"job": job, "instance": inst, "model_name": model}
        state = VLLM.new_metrics_state()
        source = f"prometheus {api.shown}"
        for ts in sorted(per[key]):
            VLLM.ingest_samples(per[key][ts], ts, tl, state, source)
        tl.meta["spelling"] = sorted(spell.get(key, set()))
        tl.meta["fleet"] = True
        tl.inputs.append(rep)
        versions[name] = state.version
        timelines.append(tl)
    if len(per) >= MAX_TARGETS:
        rep.messages.append(f"More than {MAX_TARGETS} vLLM targets match; the first {MAX_TARGETS} are read. Narrow --selector.")
    return timelines, versions
