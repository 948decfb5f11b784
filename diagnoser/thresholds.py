"""Rule thresholds: defaults in each rule, overridden by a TOML file (``[rules.NAME]`` tables) and by
``--set NAME.KEY=VALUE`` on the command line (CLI wins). An unknown rule or key is an error that lists
the valid ones."""

from __future__ import annotations

from typing import Any

from diagnoser.rules import REGISTRY


def _rule_defaults() -> dict[str, dict[str, Any]]:
    return {r.name: dict(r.defaults) for r in REGISTRY}


def _coerce(default: Any, value: Any, where: str) -> Any:
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("true", "1", "yes"):
            return True
        if str(value).lower() in ("false", "0", "no"):
            return False
        raise ValueError(f"{where} must be true or false, got {value!r}")
    if isinstance(default, int | float):
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where} must be a number, got {value!r}") from None
        return int(v) if isinstance(default, int) and v.is_integer() else v
    return value


def validate(overrides: dict[str, dict[str, Any]], origin: str) -> dict[str, dict[str, Any]]:
    defaults = _rule_defaults()
    out: dict[str, dict[str, Any]] = {}
    for rule, table in overrides.items():
        if rule not in defaults:
            raise ValueError(f"{origin}: unknown rule {rule!r}; valid rules: {', '.join(sorted(defaults))}")
        if not isinstance(table, dict):
            raise ValueError(f"{origin}: [rules.{rule}] must be a table of thresholds")
        for key, value in table.items():
            if key not in defaults[rule]:
                valid = ", ".join(sorted(defaults[rule])) or "(none)"
                raise ValueError(f"{origin}: unknown threshold {rule}.{key}; valid keys for {rule}: {valid}")
            out.setdefault(rule, {})[key] = _coerce(defaults[rule][key], value, f"{origin}: {rule}.{key}")
    return out


def load_thresholds(path: str | None = None, sets: list[str] | None = None) -> dict[str, dict[str, Any]]:
    merged: dict[str, dict[str, Any]] = {}
    if path:
        import tomllib  # only with --config: keeps the TOML parser off the plain --once start-up path

        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ValueError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"config file {path} is not valid TOML ({e})") from None
        rules = data.get("rules", {})
        unknown_top = set(data) - {"rules"}
        if unknown_top:
            raise ValueError(f"{path}: unknown section(s) {', '.join(sorted(unknown_top))}; only [rules.NAME] tables are read")
        for rule, table in validate(rules, path).items():
            merged.setdefault(rule, {}).update(table)
    for item in sets or []:
        key, sep, value = item.partition("=")
        rule, dot, name = key.partition(".")
        if not sep or not dot:
            raise ValueError(f"--set {item!r} must look like RULE.KEY=VALUE, e.g. kv_saturation.usage_high=0.9")
        for r, table in validate({rule.strip(): {name.strip(): value.strip()}}, "--set").items():
            merged.setdefault(r, {}).update(table)
    return merged
