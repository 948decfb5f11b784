"""``diagnose help [CMD]``, ``diagnose completion bash|zsh|fish`` and ``diagnose demo``.

``diagnose --help`` lists every command with one line (:data:`diagnoser.cli.COMMANDS`), then the
options of a run. ``demo`` diagnoses the recording shipped inside the package (``diagnoser/examples``),
so it works from an installed wheel, without a clone.
"""

from __future__ import annotations

import importlib
import sys
from importlib import resources
from typing import Any

from diagnoser.cli import COMMANDS, SUBCOMMANDS, UsageError, resume_gc

DEMO = "kv-full-retract.dgb"


def main_help() -> str:
    from diagnoser.cli.run import build_parser

    width = max(len(k) for k in COMMANDS)
    lines = ["usage: diagnose URL | diagnose COMMAND ...", "       diagnose [--once] [--url URL ...] [--log PATH|-] ...", "",
             "Why is my SGLang server slow, and what should I change?", "", "commands:"]
    from diagnoser.outputs.term import term_for

    t = term_for(sys.stdout, "never")
    for k, v in COMMANDS.items():
        lines += t.wrap(v, " " * (width + 4), f"  {k:<{width}}  ")
    lines += ["", *t.wrap("'diagnose help CMD' (or 'diagnose CMD --help') shows a command's options; the options of a run follow.", "", ""), ""]
    text = build_parser().format_help()
    opts = text[text.find("options:"):] if "options:" in text else text
    return "\n".join(lines) + opts


def _help(argv: list[str]) -> int:
    if not argv:
        print(main_help(), end="")
        return 0
    cmd = argv[0]
    if cmd in ("run", "--once", "URL"):
        from diagnoser.cli.run import build_parser

        print(build_parser().format_help(), end="")
        return 0
    if cmd in ("help", "completion", "demo", "rules", "explain"):
        print(f"diagnose {cmd}: {COMMANDS[cmd]}")
        return 0
    if cmd not in SUBCOMMANDS:
        raise UsageError(f"no command named that: the commands are {', '.join(k for k in COMMANDS if k[0].isalpha() and k != 'URL')}")
    mod = importlib.import_module(SUBCOMMANDS[cmd])
    resume_gc()
    try:
        return int(mod.main(cmd, ["--help"]))
    except SystemExit as e:  # argparse's --help exits 0
        return int(e.code or 0)


def _run_options() -> list[str]:
    from diagnoser.cli.run import build_parser

    return sorted({o for a in build_parser()._actions for o in a.option_strings if o.startswith("--")})


def completion(shell: str) -> str:
    cmds = " ".join(k for k in COMMANDS if k[0].isalpha() and k != "URL")
    opts = " ".join(_run_options())
    if shell == "bash":
        return f"""# diagnose completion for bash: eval "$(diagnose completion bash)" (or save it in ~/.local/share/bash-completion/completions/diagnose)
_diagnose() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}}
    if [ "$COMP_CWORD" -eq 1 ] && [[ "$cur" != -* ]]; then
        COMPREPLY=( $(compgen -W "{cmds}" -- "$cur") )
    elif [ "$COMP_CWORD" -eq 2 ] && [ "${{COMP_WORDS[1]}}" = completion ]; then
        COMPREPLY=( $(compgen -W "bash zsh fish" -- "$cur") )
    elif [ "$COMP_CWORD" -eq 2 ] && [ "${{COMP_WORDS[1]}}" = help ]; then
        COMPREPLY=( $(compgen -W "{cmds}" -- "$cur") )
    elif [[ "$cur" == -* ]]; then
        COMPREPLY=( $(compgen -W "{opts}" -- "$cur") )
    else
        COMPREPLY=( $(compgen -f -- "$cur") )
    fi
}}
complete -o default -F _diagnose diagnose
"""
    if shell == "zsh":
        return f"""#compdef diagnose
# diagnose completion for zsh: diagnose completion zsh > "${{fpath[1]}}/_diagnose" (or eval "$(diagnose completion zsh)")
_diagnose() {{
    if (( CURRENT == 2 )) && [[ $words[2] != -* ]]; then
        compadd -- {cmds}
    elif (( CURRENT == 3 )) && [[ $words[2] == completion ]]; then
        compadd -- bash zsh fish
    elif [[ $words[CURRENT] == -* ]]; then
        compadd -- {opts}
    else
        _files
    fi
}}
compdef _diagnose diagnose 2>/dev/null || true
"""
    if shell == "fish":
        lines = ["# diagnose completion for fish: diagnose completion fish > ~/.config/fish/completions/diagnose.fish"]
        for k, v in COMMANDS.items():
            if k[0].isalpha() and k != "URL":
                lines.append(f"complete -c diagnose -n __fish_use_subcommand -a {k} -d {_fish_quote(v)}")
        lines.append("complete -c diagnose -n '__fish_seen_subcommand_from completion' -a 'bash zsh fish'")
        for o in _run_options():
            lines.append(f"complete -c diagnose -l {o[2:]}")
        return "\n".join(lines) + "\n"
    raise UsageError("completion takes bash, zsh or fish: e.g. eval \"$(diagnose completion bash)\"")


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def demo_path() -> Any:
    return resources.files("diagnoser") / "examples" / DEMO


def _demo(argv: list[str]) -> int:
    from diagnoser.cli import run

    path = demo_path()
    with resources.as_file(path) as p:
        if not p.is_file():
            raise UsageError("the bundled example is missing from this installation (diagnoser/examples/" + DEMO + ")")
        print(f"diagnose demo: a recording of a real SGLang 0.5.23 run on a CPU, with a KV pool capped at 2,048 tokens ({DEMO})\n",
              file=sys.stderr)
        return int(run.main(["--once", "--replay", str(p), *argv]))


def main(cmd: str, argv: list[str]) -> int:
    if cmd == "help":
        return _help(argv)
    if cmd == "completion":
        if len(argv) != 1:
            raise UsageError("completion takes one shell: diagnose completion bash|zsh|fish")
        sys.stdout.write(completion(argv[0]))
        return 0
    if cmd == "demo":
        return _demo(argv)
    raise UsageError(f"unknown command {cmd}")
