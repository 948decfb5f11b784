"""The text outputs at a terminal's width (80 and 132 columns): no line wider than the terminal, no word
cut (a path longer than a line breaks after a '/'), colour on a TTY unless NO_COLOR or --color never;
the bundled example answers in one 80x24 screen; the markdown card; the CLI front (help, completion,
'diagnose URL'). Real runs of the installed command on the bundled recording of a real SGLang run."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from diagnoser.cli import COMMANDS, SUBCOMMANDS
from diagnoser.outputs.term import Term, shown, visible_len
from diagnoser.rules import REGISTRY

ROOT = Path(__file__).parent.parent
EXAMPLE = ROOT / "examples" / "kv-full-retract.dgb"
SINGLE_SCRAPE = ROOT / "tests" / "data" / "sglang-cpu-real" / "kv-full-retract" / "metrics_final.prom"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
SEPARATORS = "/._-=:,"


def run(*argv: str, columns: int = 80, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    e = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "COLUMNS")}
    e.update({"COLUMNS": str(columns), "PYTHONPATH": str(ROOT)}, **(env or {}))
    return subprocess.run([sys.executable, "-m", "diagnoser", *argv], capture_output=True, text=True, timeout=120, env=e, cwd=ROOT)


def on_a_tty(*argv: str, columns: int = 80, env: dict[str, str] | None = None) -> str:
    """The command's output written to a real pseudo-terminal (isatty() is true)."""
    e = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "COLUMNS", "TERM")}
    e.update({"COLUMNS": str(columns), "PYTHONPATH": str(ROOT), "TERM": "xterm"}, **(env or {}))
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "diagnoser", *argv], stdout=slave, stderr=subprocess.DEVNULL, env=e, cwd=ROOT)
    os.close(slave)
    chunks = []
    while True:
        r, _, _ = select.select([master], [], [], 60)
        if not r:
            break
        try:
            data = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    p.wait(timeout=60)
    os.close(master)
    return b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")


def words(text: str) -> list[list[str]]:
    return [ln.split() for ln in ANSI.sub("", text).splitlines()]


def assert_no_word_cut(narrow: str, wide: str) -> None:
    """Every word of ``narrow`` is a word of ``wide`` (the same report unwrapped), or a piece of one that
    ends at a separator and goes on at the start of the next line; a line cut with '…' ends on a word."""
    known = {w for ln in words(wide) for w in ln}
    stem = {w.rstrip(",;:.)") for w in known}
    lines = words(narrow)
    consumed: set[tuple[int, int]] = set()  # continuation pieces of a word broken at a separator
    for i, ln in enumerate(lines):
        for j, w in enumerate(ln):
            if (i, j) in consumed or w in known or w == "…":
                continue
            if w.endswith("…"):  # cut by Term.fit at a word boundary
                assert w[:-1].rstrip(",;:·—-") in stem or w[:-1] == "", (w, ln)
                continue
            # a word longer than the line: broken after a separator, continued at the next line's start
            assert j == len(ln) - 1 and w[-1] in SEPARATORS, (w, ln)
            joined, k = w, i + 1
            while joined not in known and k < len(lines) and lines[k]:
                assert joined[-1] in SEPARATORS, (w, joined)
                joined += lines[k][0]
                consumed.add((k, 0))
                k += 1
            assert joined in known, (w, joined)


@pytest.mark.parametrize("columns", [80, 132])
@pytest.mark.parametrize("verbose", [False, True])
def test_reports_fit_the_terminal_and_never_cut_a_word(columns: int, verbose: bool) -> None:
    v = ["--verbose"] if verbose else []
    for src in (["--replay", str(EXAMPLE)], ["--metrics-file", str(SINGLE_SCRAPE)]):
        out = run("--once", *src, *v, columns=columns)
        assert out.returncode in (0, 1), out.stderr
        assert all(len(ln) <= columns for ln in out.stdout.splitlines()), max(out.stdout.splitlines(), key=len)
        wide = run("--once", *src, *v, columns=160)  # the widest the report goes
        if verbose:
            assert_no_word_cut(out.stdout, wide.stdout)
        else:
            assert_no_word_cut(out.stdout, run("--once", *src, "--verbose", columns=160).stdout + wide.stdout)


def test_the_example_answers_in_one_80x24_screen() -> None:
    out = run("--once", "--replay", str(EXAMPLE)).stdout
    lines = out.splitlines()
    assert len(lines) <= 60
    first = next(i for i, ln in enumerate(lines) if ln.strip().startswith("Fix first:"))
    effect = next(i for i in range(first, len(lines)) if lines[i].strip().startswith("effect:"))
    end = effect
    while end + 1 < len(lines) and lines[end + 1].startswith("    ") and not lines[end + 1].strip().startswith(("Then", "2.")):
        end += 1  # the effect's wrapped lines
    assert end < 24, out  # the verdict, the findings and the first fix with its effect fit one screen
    flat = " ".join(out.split())
    assert "Fix first: --max-total-tokens 2048 → 16384 (kv_saturation)" in flat
    assert "2. --schedule-conservativeness 1.0 → 1.3 (kv_retraction)" in flat
    # detail moved to --verbose: no evidence sources, no assumptions in the default
    assert "← server.log" not in out and "Assumes:" not in out
    verbose = run("--once", "--replay", str(EXAMPLE), "--verbose").stdout
    assert "← server.log:399" in verbose and "Assumes:" in verbose and f"Rules checked ({len(REGISTRY)})" in verbose  # every rule in the catalogue ran


def test_said_once_on_a_single_scrape() -> None:
    for v in ([], ["--verbose"]):
        out = " ".join(run("--once", "--metrics-file", str(SINGLE_SCRAPE), *v).stdout.split())
        assert "0.0%" not in out and "0.00 GiB" not in out, out
        assert "unknown (not in the inputs) → 2 x the current" not in out and "unknown → 2 x" not in out
        sentences = [s for s in re.split(r"(?<=[.;:])\s+", out) if len(s) >= 50]
        assert len(sentences) == len(set(sentences)), [s for s in sentences if sentences.count(s) > 1]
    verbose = " ".join(run("--once", "--metrics-file", str(SINGLE_SCRAPE), "--verbose").stdout.split())
    assert "(as above)" in verbose  # the note that repeated the suggestion's reason says so instead
    assert "--tp-size → 2 x the current (more GPUs)" in verbose


@pytest.mark.parametrize("columns", [80, 132])
def test_colour_on_a_tty_unless_no_color_or_never(columns: int) -> None:
    coloured = on_a_tty("--once", "--replay", str(EXAMPLE), columns=columns)
    assert "\x1b[" in coloured and "kv_saturation" in coloured
    assert all(visible_len(ln) <= columns for ln in coloured.splitlines())
    assert "\x1b[" not in on_a_tty("--once", "--replay", str(EXAMPLE), columns=columns, env={"NO_COLOR": "1"})
    assert "\x1b[" not in on_a_tty("--once", "--replay", str(EXAMPLE), "--color", "never", columns=columns)
    piped = run("--once", "--replay", str(EXAMPLE), columns=columns).stdout
    assert "\x1b[" not in piped
    assert "\x1b[" in run("--once", "--replay", str(EXAMPLE), "--color", "always", columns=columns).stdout
    # the same words with and without colour
    assert ANSI.sub("", coloured).split() == piped.split()


def test_wrap_breaks_between_words_and_a_long_path_after_a_slash() -> None:
    t = Term(width=40)
    path = "python/sglang/srt/managers/scheduler_components/new_token_ratio_tracker.py"
    lines = t.wrap(f"see {path} at v0.5.23 for the ratio", "    ", "  ")
    assert all(len(ln) <= 40 for ln in lines)
    assert lines[0] == "  see"  # the path does not fit after "see": it starts a line
    path_lines = [ln.strip() for ln in lines[1:] if "/" in ln or ln.strip().startswith("new_token")]
    assert all(p.endswith("/") for p in path_lines[:-1])  # broken only after a slash
    assert "".join(path_lines).startswith(path)
    assert " ".join(ln.strip() for ln in lines).split(path.rsplit("/", 1)[1])[1].split() == ["at", "v0.5.23", "for", "the", "ratio"]
    assert t.wrap("short", "  ") == ["  short"] and t.wrap("", "  ") == [""]
    assert t.fit("a " * 40).endswith("…") and len(t.fit("a " * 40)) <= 40
    # a server's escape sequence cannot reach the terminal
    assert shown("model\x1b]0;pwned\x07name") == "model\\x1b]0;pwned\\x07name"  # shown escaped (term_safe)


def test_rules_explain_and_help_follow_the_width() -> None:
    for columns in (80, 132):
        for argv in (["rules"], ["explain", "kv_saturation"], ["--help"], ["help", "plan"]):
            out = run(*argv, columns=columns)
            assert out.returncode == 0, (argv, out.stderr)
            assert all(len(ln) <= columns for ln in out.stdout.splitlines()), (argv, max(out.stdout.splitlines(), key=len))


def test_help_lists_every_command_and_help_cmd_works() -> None:
    out = run("--help").stdout
    listed = re.findall(r"^  (\S+)\s{2,}", out.split("options:")[0], re.M)
    assert set(SUBCOMMANDS) <= set(listed) and set(listed) == set(COMMANDS)
    assert "usage: diagnose plan" in run("help", "plan").stdout
    assert "usage: diagnose compare" in run("help", "compare").stdout
    bad = run("help", "nonsense")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


def test_completion_scripts() -> None:
    script = run("completion", "bash").stdout
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    probe = script + '\nCOMP_WORDS=(diagnose co); COMP_CWORD=1; _diagnose; echo "${COMPREPLY[@]}"\n' \
        + 'COMP_WORDS=(diagnose --on); COMP_CWORD=1; _diagnose; echo "${COMPREPLY[@]}"\n'
    got = subprocess.run(["bash", "-c", probe], capture_output=True, text=True).stdout.splitlines()
    assert set(got[0].split()) == {"compare", "completion"} and got[1].split() == ["--once"]
    zsh = run("completion", "zsh").stdout
    assert zsh.startswith("#compdef diagnose") and "compare" in zsh
    if shutil.which("zsh"):
        assert subprocess.run(["zsh", "-n"], input=zsh, text=True).returncode == 0
    fish = run("completion", "fish").stdout
    assert "complete -c diagnose -n __fish_use_subcommand -a demo" in fish
    if shutil.which("fish"):
        assert subprocess.run(["fish", "-n"], input=fish, text=True).returncode == 0
    bad = run("completion", "tcsh")
    assert bad.returncode == 2 and "bash, zsh or fish" in bad.stderr


def test_a_url_alone_is_url() -> None:
    out = run("http://127.0.0.1:9", "--once", "--duration", "0", "--timeout", "2", "--format", "json")
    assert out.returncode == 2
    doc = json.loads(out.stdout)
    assert doc["findings"][0]["rule"] == "source_unreachable" and doc["findings"][0]["target"] == "http://127.0.0.1:9"
    bad = run("not-a-url", "--once")
    assert bad.returncode == 2 and "neither a command nor a URL" in bad.stderr and "not-a-url" not in bad.stderr


def test_markdown_card() -> None:
    out = run("--once", "--replay", str(EXAMPLE), "--format", "markdown")
    assert out.returncode == 1
    card = out.stdout
    assert len(card.splitlines()) <= 40
    assert card.startswith("### diagnoser: sglang 0.5.23 · PROBLEMS")
    assert "model tiny-llama" in card and "**Verdict:** kv\\_saturation (warning)" in card
    assert "1. `--max-total-tokens 2048 → 16384` (kv\\_saturation): Pool 2,048 → 16,384 tokens" in card
    assert "| server.log:399 |" in card and "from metrics kv-full-retract" in card  # numbers with their sources


def test_markdown_escapes_and_redacts_server_strings() -> None:
    from diagnoser.outputs.markdown import render_markdown

    doc = json.loads(run("--once", "--replay", str(EXAMPLE), "--format", "json").stdout)
    cfg = doc["config"]["kv-full-retract"]
    key = next(k for k in ("served_model_name", "arg.served_model_name", "model_path", "arg.model_path") if k in cfg)
    cfg[key]["value"] = "[x](http://evil) <img src=x> `tick` token=sk-abcdefabcdefabcdef0123"
    doc["findings"][0]["summary"] = "a | pipe <b>bold</b> [link](http://evil)"
    card = render_markdown(doc)
    assert not re.search(r"(?<!\\)<", card.replace("<sub>", "").replace("</sub>", "")), card  # no tag: every < escaped
    assert "](http://evil)" not in card.replace("\\]", "")
    assert "sk-abcdefabcdefabcdef0123" not in card
    assert "\\| pipe" in card and "\\[link\\]" in card


def test_markdown_of_nothing_usable_says_so(tmp_path: Path) -> None:
    junk = tmp_path / "junk.log"
    junk.write_bytes(bytes(range(256)) * 8)
    out = run("--once", "--log", str(junk), "--format", "markdown")
    assert out.returncode == 2 and "· ERROR" in out.stdout
    assert "**Verdict:** nothing usable was read: No line of" in out.stdout and "no problem found" not in out.stdout


def _wrap_word_by_word(t: Term, text: str, indent: str = "  ", first: str | None = None) -> list[str]:
    """The reference for Term.wrap: the word-by-word loop (before its one-rfind-a-line path)."""
    from diagnoser.outputs.term import _split_long

    first = indent if first is None else first
    lines: list[str] = []
    line, bare = first, True
    for w in str(text).split():
        room = t.width - len(line) - (0 if bare else 1)
        if len(w) <= room:
            line, bare = line + ("" if bare else " ") + w, False
            continue
        if not bare:
            lines.append(line)
            line, bare = indent, True
            room = t.width - len(line)
        if len(w) <= room:
            line, bare = line + w, False
            continue
        pieces = _split_long(w, max(8, room))
        for p in pieces[:-1]:
            lines.append(line + p)
            line = indent
        line, bare = line + pieces[-1], False
    if not bare or not lines:
        lines.append(line.rstrip() if bare else line)
    return lines


def test_wrap_is_the_word_by_word_loop() -> None:
    import random

    rng = random.Random(80)
    words = ["a", "to", "the", "token_usage", "10.0.0.1:30000", "—", "KV01", "x" * 30, "/very/long/path/" * 6, "y" * 90, ""]
    greedy = 0
    for _ in range(20_000):
        t = Term(width=rng.choice([40, 41, 60, 80, 120, 160]))
        text = rng.choice([" ", "  ", "\n", " \t "]).join(rng.choice(words) for _ in range(rng.randint(0, 30)))
        indent, first = rng.choice(["", "  ", "    ", "      "]), rng.choice([None, "", "  ! ", "    · ", "▸ " * 30])
        assert t.wrap(text, indent, first) == _wrap_word_by_word(t, text, indent, first), (t.width, text, indent, first)
        words_ = text.split()
        f = indent if first is None else first
        greedy += bool(words_) and len(words_[0]) <= t.width - len(f) and max(map(len, words_)) <= t.width - len(indent)
    assert greedy > 5_000
