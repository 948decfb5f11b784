"""The layout is the data flow: each layer imports only the layers before it."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "diagnoser"

# order of layers; a module may import its own layer and any earlier one
LAYERS = [
    ("model", ["diagnoser.model", "diagnoser.redact", "diagnoser.jsonout", "diagnoser"]),
    ("engines", ["diagnoser.engines"]),
    ("sources", ["diagnoser.sources"]),
    ("timeline", ["diagnoser.timeline", "diagnoser.collect", "diagnoser.replay", "diagnoser.bundle", "diagnoser.fleet"]),
    ("capacity", ["diagnoser.capacity"]),
    ("rules", ["diagnoser.rules", "diagnoser.thresholds"]),
    ("evaluate", ["diagnoser.evaluate", "diagnoser.advice", "diagnoser.live"]),
    ("outputs", ["diagnoser.outputs", "diagnoser.web", "diagnoser.cli", "diagnoser.__main__"]),
]


def layer_of(module: str) -> int | None:
    best = None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and (best is None or len(p) > best[1]):
                best = (i, len(p))
    return None if best is None else best[0]


def test_each_layer_imports_only_earlier_layers() -> None:
    bad = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).with_suffix("")
        mod = ".".join(rel.parts).removesuffix(".__init__")
        own = layer_of(mod)
        if own is None:
            bad.append(f"{mod}: not assigned to a layer in tests/test_layers.py")
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                if not name.startswith("diagnoser"):
                    continue
                other = layer_of(name)
                if other is not None and other > own and name != "diagnoser":
                    bad.append(f"{mod} (layer {LAYERS[own][0]}) imports {name} (layer {LAYERS[other][0]})")
    assert not bad, "\n".join(bad)


def engine_imports(text: str) -> list[str]:
    """Every import of ``diagnoser.engines`` in a module's source, at any depth (functions included)."""
    bad = []
    for node in ast.walk(ast.parse(text)):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                names = [("." * node.level) + (node.module or "") + "." + a.name for a in node.names]
            elif node.module == "diagnoser":
                names = [f"diagnoser.{a.name}" for a in node.names]
            elif node.module:
                names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            if name.startswith("diagnoser.engines") or (name.startswith("..") and "engines" in name):
                bad.append(f"{node.lineno}: {name}")
    if "import_module" in text and "engines" in text:
        bad.append("importlib: an engine module by name")
    return bad


def test_no_rule_imports_an_engine() -> None:
    """Rules judge canonical signals and read the engine's mechanism from the context (``ctx.mech``,
    diagnoser/mechanism.py): no rule module imports ``diagnoser.engines`` anywhere, not even lazily inside
    a function, nor by a relative import or ``importlib``."""
    bad = []
    for path in sorted((PKG / "rules").rglob("*.py")) + [PKG / "thresholds.py"]:
        bad += [f"{path.relative_to(PKG.parent)}:{b}" for b in engine_imports(path.read_text())]
    assert not bad, "\n".join(bad)


def test_the_check_catches_a_lazy_engine_import() -> None:
    lazy = "def f():\n    from diagnoser.engines.sglang.scheduler_model import vet\n    return vet\n"
    assert engine_imports(lazy) == ["2: diagnoser.engines.sglang.scheduler_model"]
    assert engine_imports("from diagnoser import engines\n") == ["1: diagnoser.engines"]
    assert engine_imports("from ..engines.vllm import flags\n") == ["1: ..engines.vllm.flags"]
    assert engine_imports("import diagnoser.engines.vllm\n") == ["1: diagnoser.engines.vllm"]
    assert engine_imports("from diagnoser.mechanism import Mechanism\n") == []


def test_every_engine_provides_a_mechanism() -> None:
    """Each adapter carries the mechanism the rules read; a third engine plugs in the same way."""
    from diagnoser.engines.auto import _adapters
    from diagnoser.mechanism import Mechanism

    for name, adapter in _adapters().items():
        mech = adapter.mechanism
        assert mech.name == name
        for attr in Mechanism.__annotations__:
            assert hasattr(mech, attr), f"{name}'s mechanism lacks {attr}"
        for meth in ("admission_ratio", "kv_blocked", "state_of", "vet", "startup_fraction_fix"):
            assert callable(getattr(mech, meth)), f"{name}'s mechanism lacks {meth}()"
