"""Evaluate the rule catalogue over each target's timeline window.

* Each rule is isolated: one that raises is listed under ``errors`` and the rest still run.
* Suggestions are merged across findings and checked: none proposes the current value, none
  contradicts another (same flag, different value or direction), none is on the never-propose list
  (``--cpu-offload-gb`` never raises throughput).
* Live use: :class:`Hysteresis` turns per-pass findings into pending → firing → resolved states.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from types import MappingProxyType
from typing import Any

from diagnoser import forkmap, gcpause
from diagnoser.mechanism import mechanism_of
from diagnoser.model import Finding, Severity, Suggestion
from diagnoser.rules import REGISTRY, Rule
from diagnoser.rules.base import RuleContext
from diagnoser.timeline import Timeline

NEVER_PROPOSE = {"--cpu-offload-gb"}


@dataclass(slots=True)
class RuleError:
    rule: str
    target: str
    error: str

    def to_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "target": self.target, "error": self.error}


@dataclass(slots=True)
class Report:
    findings: list[Finding] = field(default_factory=list)
    errors: list[RuleError] = field(default_factory=list)
    duration_s: float = 0.0
    dropped: list[dict[str, Any]] = field(default_factory=list)  # suggestions refused by the checks
    # every rule that ran, per target: {"rule", "code", "target", "status": fired|fine|not_judged|error, "why"}
    checked: list[dict[str, Any]] = field(default_factory=list)


def version_tuple(tl: Timeline) -> tuple[int, int, int] | None:
    from diagnoser.engines.sglang.versions import parse_version

    v = tl.meta.get("version_best")
    if v:
        return tuple(v)  # type: ignore[return-value]
    return parse_version(tl.version) if tl.version and tl.version[0].isdigit() else None


def select_rules(select: list[str] | None = None, ignore: list[str] | None = None) -> list[type[Rule]]:
    rules = list(REGISTRY)
    if select:
        want = set(select)
        rules = [r for r in rules if r.name in want or r.code in want]
    if ignore:
        drop = set(ignore)
        rules = [r for r in rules if r.name not in drop and r.code not in drop]
    return rules


# target rules over this many timelines or more are split over worker processes (diagnoser/forkmap.py:
# a fork and the results sent back cost tens of ms; a target costs about 1 ms)
PARALLEL_MIN_TARGETS = 500


# the pass allocates millions of acyclic objects (contexts, arrays, findings): no cyclic collection inside
# it (1.2 s of 9 at 10,000 fleet targets, bench/bench_fleet.py; diagnoser/gcpause.py)
@gcpause.paused()
def evaluate(
    timelines: list[Timeline],
    adapter: Any,
    thresholds: dict[str, dict[str, Any]] | None = None,
    rules: list[type[Rule]] | None = None,
    extras: dict[str, Any] | None = None,
    workers: int | None = None,
    meanwhile: Callable[[], None] | None = None,
) -> Report:
    """Run the target rules over each timeline and the fleet rules over all of them, then check the
    suggestions and put the findings in the report's one order. ``workers``: processes to split the
    target rules over (None: :func:`diagnoser.forkmap.workers_for`, by the CPUs and the targets; 1: here).
    ``meanwhile``: the caller's work that does not need the findings (the report's signal tables), run in
    this process while the workers judge targets (always run, once)."""
    t0 = time.perf_counter()
    report = Report()
    rules = rules if rules is not None else list(REGISTRY)
    thresholds = thresholds or {}
    instances = [r() for r in rules]
    target_rules = [(rule, rule.defaults, thresholds.get(rule.name)) for rule in instances if rule.scope == "target"]
    fleet_rules = [r for r in instances if r.scope == "fleet"]
    fleet: list[tuple[list[Finding], list[RuleError], list[dict[str, Any]]]] = []

    def here() -> None:  # this process's own work while workers judge targets: the fleet rules read only timelines
        fleet.append(_judge_fleet(fleet_rules, timelines, thresholds, adapter))
        if meanwhile is not None:
            meanwhile()

    if target_rules and timelines:
        n = workers if workers is not None else forkmap.workers_for(len(timelines), PARALLEL_MIN_TARGETS)
        parts = forkmap.split_map(partial(_judge, target_rules, adapter, extras), timelines, n, meanwhile=here)
    else:
        here()
        parts = []
    for findings, errors, checked in (*parts, *fleet):  # (the fleet rules' after the targets', as they always came)
        report.findings.extend(findings)
        report.errors.extend(errors)
        report.checked.extend(checked)
    check_suggestions(report, timelines, extras)
    report.findings[:] = cause_order(report.findings)
    report.duration_s = time.perf_counter() - t0
    return report


def _judge_fleet(fleet_rules: list[Rule], timelines: list[Timeline], thresholds: dict[str, dict[str, Any]],
                 adapter: Any) -> tuple[list[Finding], list[RuleError], list[dict[str, Any]]]:
    """The fleet rules over all the timelines: (findings, errors, checked)."""
    findings: list[Finding] = []
    errors: list[RuleError] = []
    checked: list[dict[str, Any]] = []
    for rule in fleet_rules:
        cfg = dict(rule.defaults)
        cfg.update(thresholds.get(rule.name, {}))
        try:
            out = rule.evaluate_fleet(timelines, cfg, adapter)  # type: ignore[attr-defined]
        except Exception as e:
            errors.append(RuleError(rule.name, "fleet", f"{type(e).__name__}: {e}"))
            checked.append(_checked(rule, "fleet", "error", f"the rule failed: {type(e).__name__}"))
            continue
        checked.append(_checked(rule, "fleet", "fired" if out else "fine",
                                "see its finding" if out else f"over {len(timelines)} target(s), its condition did not hold"))
        findings.extend(out or [])
    return findings, errors, checked


def _judge(target_rules: list[tuple[Rule, dict[str, Any], dict[str, Any] | None]], adapter: Any, extras: dict[str, Any] | None,
           timelines: Sequence[Timeline]) -> tuple[list[Finding], list[RuleError], list[dict[str, Any]]]:
    """The target rules over ``timelines``, in order: (findings, errors, checked). A pure function of its
    arguments (it may run in a worker process: what it writes elsewhere is lost)."""
    findings: list[Finding] = []
    errors: list[RuleError] = []
    checked: list[dict[str, Any]] = []
    # each rule's thresholds, read-only: one view per rule for every target (a rule cannot change them)
    views = [(rule, MappingProxyType({**defaults, **override} if override else dict(defaults))) for rule, defaults, override in target_rules]
    pick = getattr(adapter, "for_timeline", None)  # an adapter choosing per input: this target's engine
    for tl in timelines:
        # one context for the timeline's rules: they share its memo (joins, stats)
        tl_adapter = pick(tl) if pick is not None else adapter
        ctx = RuleContext(tl, {}, tl_adapter, version_tuple(tl), dict(extras or {}), {})
        target = tl.target
        for rule, view in views:
            ctx.thresholds = view  # type: ignore[assignment]
            try:
                out = rule.evaluate(ctx)
            except Exception as e:  # isolation: a broken rule is reported, the rest still run
                errors.append(RuleError(rule.name, target, f"{type(e).__name__}: {e}"))
                checked.append(_checked(rule, target, "error", f"the rule failed: {type(e).__name__}"))
                continue
            if not out:
                checked.append(_checked(rule, target, *why_fine(rule, ctx)))
                continue
            checked.append(_checked(rule, target, "fired", "see its finding"))
            for f in out if isinstance(out, list) else [out]:
                if tl_adapter is not adapter:  # a concept the engine has no flag for is spelled "(no … flag: …)": not shown
                    f.suggestions = [s for s in f.suggestions if str(s.flag).startswith("--")]
                rule.settle_basis(ctx, f)  # how many readings over how long; caps the confidence
                findings.append(f)
    return findings, errors, checked


def _checked(rule: Rule, target: str, status: str, why: str) -> dict[str, Any]:
    return {"rule": rule.name, "code": rule.code, "target": target, "status": status, "why": why}


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def why_fine(rule: Rule, ctx: RuleContext) -> tuple[str, str]:
    """Why a rule that ran found nothing: ``("fine", what it read and that its condition did not hold)``,
    or ``("not_judged", which input is missing)`` when the inputs hold none of the signals it reads (nor
    its log events). A rule on log events alone is fine when none is there: their absence is the answer.

    The sentence depends only on the rule, the number of readings of each signal and of each event kind
    read, and the engine's words: it is made once per such key (:func:`_why_text`; a fleet pass asks it
    200,000 times for a few hundred distinct sentences)."""
    signals = _WHY_SIGNALS.get(type(rule))
    if signals is None:
        signals = _WHY_SIGNALS[type(rule)] = tuple(dict.fromkeys((*rule.reads, *rule.needs)))
    series = ctx.series
    read = tuple((sig, len(s)) for sig in signals for s in (series(sig),) if s is not None)
    seen = tuple((k, n) for k in rule.events for n in (len(ctx.events_of(k)),) if n)
    key = (type(rule), read, seen, ctx.mech if rule.events and not read and not seen else None)
    hit = _WHY.get(key)
    if hit is None:
        if len(_WHY) >= _WHY_MAX:
            _WHY.clear()
        hit = _WHY[key] = _why_text(rule, signals, read, seen, ctx)
    return hit


_WHY_SIGNALS: dict[type, tuple[str, ...]] = {}
_WHY: dict[tuple[Any, ...], tuple[str, str]] = {}
_WHY_MAX = 4096


def _why_text(rule: Rule, signals: tuple[str, ...], read: tuple[tuple[str, int], ...], seen: tuple[tuple[str, int], ...],
              ctx: RuleContext) -> tuple[str, str]:
    if signals and not read and not seen:
        return "not_judged", f"no {', '.join(signals)} readings in the inputs"
    parts = [_plural(n, f"{sig} reading") for sig, n in read] + [_plural(n, f"{k} event") for k, n in seen]
    if not parts and rule.events:  # a rule on log events: none of them is its answer
        kinds = [ctx.mech.words.get(k, k) for k in rule.events if k not in ctx.mech.no_events]  # as the engine names them
        return "fine", f"no {', '.join(kinds)} events in the inputs" if kinds else "the engine logs none of the events it reads"
    if not parts:
        return "fine", "its condition did not hold"
    return "fine", f"read {', '.join(parts)}: its condition did not hold"


# rules that say *what* happens (requests wait, the batch is small), not why: a cause rule names the why
SYMPTOMS = frozenset({"queue_buildup", "low_batch_occupancy", "high_latency"})
INPUT_RULES = frozenset({"source_unreachable", "metrics_disabled", "insufficient_data"})
FATAL = frozenset({"engine_crash", "oom"})  # the server stopped serving: that comes before any slowness


def cause_key(f: Finding) -> tuple[int, int, int]:
    """Sort key of the findings for "the top cause": an input that cannot be read or a server that stopped
    serving (a crash, an OOM; at warning or above), then the causes, then the symptoms; within each, warning-or-worse before info, then the catalogue
    order (``REGISTRY``: the pool before what it leads to, retraction and queues). Confidence plays no
    part, so a log, scrapes and Prometheus of one run name the same top cause."""
    return cause_rank(f.rule, f.severity)


def cause_rank(rule: str, severity: Severity | str) -> tuple[int, int, int]:
    """:func:`cause_key` from a rule name and a severity (or its label, as in a finding document)."""
    sev = Severity.parse(severity) if isinstance(severity, str) else severity
    order = {r.name: i for i, r in enumerate(REGISTRY)}
    serious = sev >= Severity.WARNING
    role = (0 if (rule in INPUT_RULES or rule in FATAL) and serious else 3 if rule in INPUT_RULES
            else 2 if rule in SYMPTOMS else 1)
    return role, 0 if serious else 1, order.get(rule, len(order))


# what a cause explains: the findings on its target that follow from it (the queue_buildup note names
# kv_saturation, max_running_requests_cap and prefill_stall as the causes of a queue)
EXPLAINS: dict[str, frozenset[str]] = {
    "kv_saturation": frozenset({"kv_retraction", "queue_buildup", "low_batch_occupancy", "high_latency"}),
    "kv_pool_too_small": frozenset({"kv_saturation", "kv_retraction", "queue_buildup", "low_batch_occupancy", "high_latency"}),
    "max_running_requests_cap": frozenset({"queue_buildup", "high_latency"}),
    "prefill_stall": frozenset({"queue_buildup", "high_latency"}),
    "prefill_decode_interference": frozenset({"high_latency"}),
    "client_bound": frozenset({"low_batch_occupancy"}),
    "oom": frozenset({"engine_crash", "kv_retraction"}),
    "engine_crash": frozenset({"source_unreachable"}),
}


def _notes() -> frozenset[str]:
    return frozenset(r.name for r in REGISTRY if r.note)


def explains(cause: str, other: str) -> bool:
    """Whether the finding ``other`` follows from the top cause ``cause`` of the same target (:data:`EXPLAINS`)."""
    return other in EXPLAINS.get(cause, frozenset())


def cause_order(findings: list[Finding]) -> list[Finding]:
    """The one order of the findings every output shows (text, watch, JSON, the dashboard, the exporter):
    per target, its top cause (:func:`cause_key`'s first, firing before pending; a note about the inputs
    or a resolved finding never leads), then what that cause explains (:func:`explains`, in :func:`cause_key` order), then the
    rest by severity (then :func:`cause_key`). Targets come worst first: by their top cause's severity,
    then by name, so ``findings[0]`` is the top cause of the worst target."""
    notes = _notes()
    groups: dict[str, list[Finding]] = {}
    for f in findings:
        groups.setdefault(f.target, []).append(f)
    ordered: list[tuple[tuple[int, str], list[Finding]]] = []
    for target, mine in groups.items():
        mine = sorted(mine, key=lambda f: (cause_key(f), f.rule))
        # a firing finding leads before a pending one (live mode), so the cards lead with what fired
        leads = sorted((f for f in mine if f.state != "resolved" and f.rule not in notes), key=lambda f: f.state == "pending")
        if not leads:
            rest = sorted(mine, key=lambda f: (-int(f.severity), cause_key(f), f.rule))
            ordered.append(((0, target), rest))
            continue
        top = leads[0]
        explained = [f for f in mine if f is not top and explains(top.rule, f.rule)]
        taken = {id(top), *map(id, explained)}
        rest = sorted((f for f in mine if id(f) not in taken), key=lambda f: (-int(f.severity), cause_key(f), f.rule))
        ordered.append(((-int(top.severity), target), [top, *explained, *rest]))
    ordered.sort(key=lambda g: g[0])
    return [f for _, fs in ordered for f in fs]


def top_cause(findings: list[Finding], target: str) -> tuple[Finding | None, Suggestion | None]:
    """The finding that names the bottleneck of one target, and the change to make first: the top
    finding's first suggestion, else the first suggestion of the next causes in :func:`cause_key` order."""
    notes = _notes()  # a note about the inputs (too few readings) names no cause
    mine = sorted((f for f in findings if f.target == target and f.state != "resolved" and f.rule not in notes), key=cause_key)
    if not mine:
        return None, None
    first = mine[0]
    for f in mine:
        if f.rule in SYMPTOMS or f.rule in INPUT_RULES:
            continue
        if f.suggestions:
            return first, f.suggestions[0]
    return first, None


def _norm(v: Any) -> Any:
    if isinstance(v, str):
        s = v.strip().lower()
        if s in ("true", "false"):  # a switch written out ("--enable-chunked-prefill True") is the bool
            return s == "true"
        try:
            return float(s)
        except ValueError:
            return s
    if isinstance(v, bool):
        return v
    if isinstance(v, int | float):
        return float(v)
    return v


def _direction(s: Suggestion) -> int:
    try:
        cur, new = float(s.current), float(s.proposed)
    except (TypeError, ValueError):
        return 0
    return (new > cur) - (new < cur)


def _current_in(tl: Timeline | None, flag: str) -> Any:
    """The flag's current value as the inputs show it (config fact or server arg), None when absent."""
    if tl is None:
        return None
    name = flag.lstrip("-").replace("-", "_")
    v = tl.cfg(name)
    return tl.cfg(f"arg.{name}") if v is None else v


def _extra_flags(s: Suggestion) -> list[tuple[str, str]]:
    """The other changes a suggestion needs ("Needs also: --mem-fraction-static 0.9"), as (flag, value)."""
    out = []
    for item in (s.projection or {}).get("extra_flags") or []:
        flag, _, value = str(item).partition(" ")
        if flag.startswith("--"):
            out.append((flag, value.strip()))
    return out


def mechanism_for(tl: Timeline | None) -> Any:
    """The mechanism of the timeline's engine (diagnoser/mechanism.py): SGLang's when none is named."""
    from diagnoser.engines.auto import AutoAdapter

    return mechanism_of(AutoAdapter().for_timeline(tl))


def state_for(tl: Timeline, extras: dict[str, Any] | None = None) -> Any:
    """The state the engine's vetting reads: its own (vLLM), else SGLang's ServerState."""
    from diagnoser.capacity.serverstate import prompt_tokens, server_state

    got = mechanism_for(tl).state_of(tl.cfg, version_tuple(tl))
    if got is None:
        return server_state(tl, extras)
    if hasattr(got, "prompt_tokens"):
        got.prompt_tokens = prompt_tokens(tl)
    if hasattr(got, "request_tokens"):
        got.request_tokens = request_tokens(tl)
    return got


def request_tokens(tl: Timeline) -> float | None:
    """Mean tokens a finished request held at its full length (prompt + output per request), from the counters."""
    from diagnoser.timeline.derived import window_rate

    p, o, r = window_rate(tl, "prompt_tps").value, window_rate(tl, "output_tps", decoded=False).value, window_rate(tl, "request_rate").value
    return (p + o) / r if p is not None and o is not None and r else None


def vet_suggestion(f: Finding | None, s: Suggestion, state: Any, current: Any, tl: Timeline | None = None) -> tuple[Suggestion | None, str]:
    """Pass one suggestion through SGLang's scheduler and memory model
    (:func:`diagnoser.engines.sglang.scheduler_model.vet`): (the suggestion, possibly capped or rewritten
    with the flag that binds; None when SGLang's own code makes it a no-op) and the reason.

    With the target's timeline, a rewrite that would repeat or escalate a value its log's last start-up
    failed with (:func:`failed_at_startup`) is refused: the suggestion stays as proposed (the rewrite rests
    on a pool that start-up never had), and a cap that lands there is dropped."""
    mech = mechanism_for(tl)
    for flag, value in _extra_flags(s):  # vetted on the state the changes it needs leave (engine's own model)
        state = mech.state_after(state, flag, value)
    v = mech.vet(s.flag, current, s.proposed, state)
    if v.kind == "ok":
        return s, ""
    where = f" ({v.cites})" if v.cites else ""
    if v.kind == "noop" or v.flag is None or v.proposed is None:
        return None, f"no effect: {v.reason}{where}"
    if v.kind == "capped" and v.flag == s.flag:
        out = replace(s, current=s.current if s.current is not None else v.current, proposed=v.proposed,
                      why=f"{s.why}; {v.reason}", projection=None)
        refused = failed_at_startup(tl, out) if tl is not None else ""
        return (None, refused) if refused else (out, "")
    why = f"{v.reason}{where}"
    eff = "the change the model says binds: " + (s.effect or "grows the pool")
    out = Suggestion(flag=v.flag, current=v.current, proposed=v.proposed, why=why, effect=eff,
                     assumptions=tuple(a for a in s.assumptions))
    refused = failed_at_startup(tl, out) if tl is not None else ""
    if refused:
        if f is not None:
            note = f"{s.flag} {_shown(current)} → {s.proposed} stays: {out.flag} {_shown(out.current)} → {out.proposed} {refused}."
            if note not in f.notes:
                f.notes.append(note)
        return s, ""
    return out, ""


def check_suggestions(report: Report, timelines: list[Timeline], extras: dict[str, Any] | None = None) -> None:
    """Refuse suggestions that SGLang's own code makes a no-op, that propose the current value, a
    never-propose flag, or contradict; cap or rewrite those the scheduler model says bind elsewhere.

    Run after every step that adds or changes suggestions (the rules, then ``advice.enrich``). The
    current value is the suggestion's own, else the one in the inputs; the other changes a suggestion
    needs (its projection's ``extra_flags``) are checked against the suggestions kept."""

    by_target = {tl.target: tl for tl in timelines}
    states: dict[str, Any] = {}
    chosen: dict[tuple[str, str], tuple[Finding, Suggestion]] = {}
    order = sorted(report.findings, key=lambda f: (-int(f.severity), -{"high": 3, "medium": 2, "low": 1}.get(f.confidence, 0)))
    for f in order:
        kept: list[Suggestion] = []
        for s in f.suggestions:
            reason = ""
            tl = by_target.get(f.target)
            s, missing = _at_release(f, s, tl)
            if missing:
                _drop(report, f, s, missing)
                continue
            current = s.current if s.current is not None else _current_in(tl, s.flag)
            failed = failed_at_startup(tl, s) if tl is not None else ""
            if failed:
                _drop(report, f, s, failed)
                continue
            if tl is not None and s.flag not in NEVER_PROPOSE and not (current is not None and _norm(current) == _norm(s.proposed)):
                if f.target not in states:
                    states[f.target] = state_for(tl, extras)
                vetted, why = vet_suggestion(f, s, states[f.target], current, tl)
                if vetted is None:
                    _drop(report, f, s, why)
                    continue
                if vetted is not s:
                    if vetted.flag != s.flag:
                        f.notes.append(f"{s.flag} {_shown(current)} → {s.proposed} became {vetted.flag} {_shown(vetted.current)} → "
                                       f"{vetted.proposed}: {vetted.why}")
                    s = vetted
                    current = s.current if s.current is not None else _current_in(tl, s.flag)
            if s.flag in NEVER_PROPOSE:
                reason = f"{s.flag} is never proposed: it frees GPU memory but slows every decode step"
            elif current is not None and _norm(current) == _norm(s.proposed):
                reason = "proposes the current value"
            else:
                key = (f.target, s.flag)
                prev = chosen.get(key)
                if prev is not None:
                    pf, ps = prev
                    same_dir = _direction(ps) == _direction(s) and _direction(s) != 0
                    if _norm(ps.proposed) == _norm(s.proposed):
                        reason = f"same change already suggested by {pf.rule}"
                    elif same_dir:
                        reason = f"{pf.rule} already suggests {s.flag} {ps.proposed}"
                    else:
                        reason = f"contradicts {pf.rule}, which suggests {s.flag} {ps.proposed}"
                else:
                    chosen[key] = (f, s)
            if reason:
                _drop(report, f, s, reason)
            else:
                kept.append(s)
        kept.sort(key=lambda s: -(s.gain or 0.0))
        f.suggestions = kept
    for f in order:  # the changes a kept suggestion needs as well must not break the checks either
        kept = []
        for s in f.suggestions:
            reason = ""
            for flag, value in _extra_flags(s):
                prev = chosen.get((f.target, flag))
                if flag in NEVER_PROPOSE:
                    reason = f"needs {flag}, which is never proposed"
                elif prev is not None and prev[1] is not s and _norm(prev[1].proposed) != _norm(value):
                    pf, ps = prev
                    up = _direction(Suggestion(flag, ps.current, value, ""))
                    if up == 0 or up != _direction(ps):
                        reason = f"needs {flag} {value}, which contradicts {pf.rule}, which suggests {flag} {ps.proposed}"
                if reason:
                    break
            if reason:
                chosen.pop((f.target, s.flag), None)
                _drop(report, f, s, reason)
            else:
                kept.append(s)
        f.suggestions = kept
    _order_pool_before_conservativeness(order)


def _at_release(f: Finding, s: Suggestion, tl: Timeline | None) -> tuple[Suggestion, str]:
    """The suggestion as the detected SGLang release spells it (the catalogue of its ServerArgs), and its
    default as the current value when the inputs show none; a reason to drop it when that release has no
    such setting. A version diagnoser could not detect, or a flag no release has, is left as it is."""
    from diagnoser.engines.sglang import flags

    version = version_tuple(tl) if tl is not None else None
    if tl is not None and (tl.engine or "sglang") != "sglang":
        return s, ""  # another engine's flags are spelled per release by its adapter (engines/vllm/flags.py)
    if version is None or not s.flag.startswith("--") or not flags.known_flag(s.flag):
        return s, ""
    rf = flags.respell(s.flag, version)
    if rf is None:
        return s, f"{s.flag} does not exist in SGLang {_release_name(version)} (its ServerArgs, catalogue)"
    if rf.flag != s.flag:
        f.notes.append(f"{s.flag} is spelled {rf.flag} in SGLang {rf.release}")
        s = replace(s, flag=rf.flag)
    # the release's default is the current value only when the server's arguments were read (a flag left
    # out of them is at its default); from a scrape alone the flag may have been set to anything
    args_read = tl is not None and any(k.startswith("arg.") for k in tl.config)
    if (args_read and s.current is None and _current_in(tl, s.flag) is None
            and isinstance(rf.default, int | float) and not isinstance(rf.default, bool)):
        s = replace(s, current=rf.default)
    return s, ""


def _release_name(version: tuple[int, int, int]) -> str:
    from diagnoser.engines.sglang import catalogue

    return catalogue.releases()[catalogue.indices_for(version)[-1]]


_GROWS_POOL = ("--max-total-tokens", "--mem-fraction-static")


def _order_pool_before_conservativeness(findings: list[Finding]) -> None:
    """A larger pool and a higher ``--schedule-conservativeness`` pull the running batch opposite ways:
    when both are kept for one target, the pool change comes first and the conservativeness only if
    retractions persist after it (a larger pool cuts retractions without shrinking the batch)."""
    grows: dict[str, Suggestion] = {}
    for f in findings:
        for s in f.suggestions:
            if s.flag in _GROWS_POOL and _direction(s) > 0:
                grows.setdefault(f.target, s)
    for f in findings:
        g = grows.get(f.target)
        if g is None:
            continue
        for i, s in enumerate(f.suggestions):
            if s.flag == "--schedule-conservativeness" and _direction(s) > 0 and "only if retractions persist" not in s.why:
                f.suggestions[i] = replace(s, why=f"{s.why}; apply it after {g.flag} {_shown(g.current)} → {g.proposed}, and "
                                           "only if retractions persist: the larger pool cuts retractions without shrinking the batch")


def _shown(v: Any) -> str:
    return "unset" if v is None else str(v)


# flags whose larger value needs more memory: after a start-up that failed for memory with one of them set,
# the same value or a larger one fails the same way (issue 25: --max-total-tokens 32768 -> 65536 failed,
# and 131072 was proposed next)
MEMORY_GROWING = frozenset({"--max-total-tokens", "--max-running-requests", "--chunked-prefill-size", "--max-prefill-tokens",
                            "--cuda-graph-max-bs", "--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill", "--context-length",
                            "--hicache-size", "--max-mamba-cache-size"})


def failed_at_startup(tl: Timeline, s: Suggestion) -> str:
    """Why ``s`` repeats or escalates a value the log's last start-up ran with and failed for memory, else "".

    The log's last start-up (its ``server_args`` line) ran with the flag's value as read there; when a
    memory failure at start-up follows that line, proposing that value again never helps, and for a flag
    whose larger value needs more memory (:data:`MEMORY_GROWING`) neither does a larger one."""
    starts = [e for e in tl.events if e.kind == "server_args"]
    last = starts[-1].ts if starts else None
    fails = [e for e in tl.events if e.kind == "startup_oom" or (e.kind == "oom" and e.fields.get("phase") == "startup")]
    fails = sorted((e for e in fails if last is None or e.ts >= last), key=lambda e: e.kind != "startup_oom")  # its own line first
    if not fails:
        return ""
    fact = tl.config.get("arg." + s.flag.lstrip("-").replace("-", "_"))
    if fact is None or isinstance(fact.value, bool) or not isinstance(fact.value, int | float):
        return ""
    tried, proposed = fact.value, s.proposed
    if isinstance(proposed, bool) or not isinstance(proposed, int | float):
        return ""
    why = f"the start-up with {s.flag} {_shown(tried)} ({fact.source}) failed for memory ({fails[0].source})"
    if _norm(tried) == _norm(proposed):
        return f"repeats a failed start-up: {why}"
    if s.flag in MEMORY_GROWING and tried > 0 and proposed > tried:
        return f"escalates a failed start-up: {why}, and a larger value needs more memory"
    return ""


def _drop(report: Report, f: Finding, s: Suggestion, reason: str) -> None:
    report.dropped.append({"rule": f.rule, "target": f.target, "flag": s.flag, "proposed": s.proposed, "reason": reason})
    if reason.startswith("same change") or "already suggests" in reason:
        f.notes.append(f"{s.flag} → {s.proposed}: see {reason.split(' by ')[-1].split(' already')[0]}")
    elif "does not exist in SGLang" in reason:
        f.notes.append(f"{s.flag} → {s.proposed} is not suggested: {reason}.")
    elif reason.startswith(("repeats a failed start-up", "escalates a failed start-up")):
        f.notes.append(f"{s.flag} → {s.proposed} is not suggested: it {reason}.")
    elif reason.startswith("no effect: "):
        note = f"{s.flag} {_shown(s.current)} → {s.proposed} is not suggested: {reason[len('no effect: '):]}."
        if note not in f.notes:
            f.notes.append(note)


@dataclass(slots=True)
class _State:
    since: float
    state: str
    finding: Finding


class Hysteresis:
    """pending → firing after the rule's ``for`` duration; firing → resolved when it stops matching."""

    def __init__(self, for_seconds: dict[str, float] | None = None) -> None:
        self.for_seconds = for_seconds or {r.name: r.for_seconds for r in REGISTRY}
        self.active: dict[tuple[str, str], _State] = {}
        self.resolved: list[Finding] = []

    def update(self, findings: list[Finding], now: float | None = None) -> list[Finding]:
        now = time.time() if now is None else now
        seen = set()
        out: list[Finding] = []
        for f in findings:
            key = (f.target, f.rule)
            seen.add(key)
            st = self.active.get(key)
            hold = self.for_seconds.get(f.rule, 0.0)
            if f.severity <= Severity.INFO or f.rule in ("source_unreachable", "metrics_disabled"):
                hold = 0.0
            if st is None:
                st = self.active[key] = _State(now, "pending", f)
            st.finding = f
            st.state = "firing" if now - st.since >= hold else "pending"
            f.state = st.state
            out.append(f)
        self.resolved = []
        for key in list(self.active):
            if key not in seen:
                st = self.active.pop(key)
                if st.state == "firing":
                    st.finding.state = "resolved"
                    self.resolved.append(st.finding)
        return out
