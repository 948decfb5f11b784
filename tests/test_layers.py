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
