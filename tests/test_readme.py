"""README.md is a user's README: short, no study results, and every link, `make` target and `isosweep` command
in it real.

The dated findings live in ``dashboards/FINDINGS.md`` and the studies' ``NOTES.md`` (STYLE.md rule 16); the user
guide in ``platform/docs/``. The README holds no date: when a usage figure (a run's time, the example output) was
measured is said in FINDINGS.md. Commands are parsed by the ``isosweep`` command's own
parser and never run, so the check costs no work.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from isosweep import cli

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 300
LINKED = [README, ROOT / "dashboards" / "FINDINGS.md", ROOT / "sweeps" / "README.md",
          *sorted((ROOT / "platform" / "docs").glob("*.md"))]

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
MAKE = re.compile(r"(?:^|[\s;&|'\"(])make\s+(?:-\S+\s+)*([A-Za-z][\w.-]*)(?=\s|$|['\";&|)])")
TARGET = re.compile(r"^([A-Za-z0-9_.-]+(?:[ \t]+[A-Za-z0-9_.-]+)*)[ \t]*:(?![=:])", re.M)
ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def code_lines(text: str) -> list[str]:
    """The lines inside the fenced code blocks of a markdown text."""
    lines, inside = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            inside = not inside
        elif inside:
            lines.append(line)
    return lines


def commands(line: str) -> list[list[str]]:
    """The shell commands of one code line, each as its words without leading ``VAR=value`` assignments (a
    ``# comment`` dropped; ``a && b``, ``a; b`` and ``a | b`` split); none for a line that is not shell (a
    program's output with an apostrophe)."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return []
    out, current = [], []
    for word in [*words, ";"]:
        if word in ("&&", "||", ";", "|"):
            while current and ENV.match(current[0]):
                current.pop(0)
            if current:
                out.append(current)
            current = []
        else:
            current.append(word)
    return out


def isosweep_commands(text: str) -> list[list[str]]:
    """The argument lists of every ``isosweep`` (or ``.venv/bin/isosweep``) command in the code blocks."""
    found = []
    for line in code_lines(text):
        for words in commands(line):
            if words[0] in ("isosweep", ".venv/bin/isosweep"):
                found.append(words[1:])
    return found


def make_names(text: str) -> set[str]:
    """The targets of every ``make`` command in the code blocks (comments dropped, quoted commands included)."""
    names = set()
    for line in code_lines(text):
        try:
            line = " ".join(shlex.split(line, comments=True))
        except ValueError:  # not shell: read as it is
            pass
        names.update(MAKE.findall(line))
    return names


def make_targets() -> set[str]:
    """The targets the Makefile defines (rules and .PHONY), not its variable assignments."""
    text = (ROOT / "Makefile").read_text()
    targets = {name for names in TARGET.findall(text) for name in names.split()}
    return {t for t in targets if not t.startswith(".")} | {
        t for line in text.splitlines() if line.startswith(".PHONY:") for t in line.split(":", 1)[1].split()}


class Parsed(Exception):
    """Raised in place of running a command: the namespace its arguments parsed to."""

    def __init__(self, namespace: argparse.Namespace):
        super().__init__(namespace)
        self.namespace = namespace


def parse(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> argparse.Namespace:
    """``argv`` parsed by the parser the ``isosweep`` command uses (``cli.build_parser``; where the CLI has none,
    the one ``cli.main`` builds, stopped at its ``parse_args``); the command itself never runs."""
    try:
        if hasattr(cli, "build_parser"):
            return cli.build_parser().parse_args(argv)
        real = argparse.ArgumentParser.parse_args

        def parse_only(self, args=None, namespace=None):
            raise Parsed(real(self, args, namespace))

        # main() calls parse_args once, on the top-level parser (subcommands parse through parse_known_args)
        with monkeypatch.context() as patch:
            patch.setattr(argparse.ArgumentParser, "parse_args", parse_only)
            cli.main(argv)
    except Parsed as parsed:
        return parsed.namespace
    except SystemExit as exit_:
        pytest.fail(f"isosweep {shlex.join(argv)}: the parser refused it ({exit_.code}): {capsys.readouterr().err}")
    pytest.fail(f"isosweep {shlex.join(argv)}: main() returned without parsing")


def test_the_readme_is_at_most_300_lines():
    assert len(README.read_text().splitlines()) <= MAX_LINES


def test_the_readme_holds_no_date():
    # dated findings, and when a usage figure was measured, belong in dashboards/FINDINGS.md, not the guide
    dated = [line for line in README.read_text().splitlines() if DATE.search(line)]
    assert not dated, f"dated lines in README.md (move them to dashboards/FINDINGS.md): {dated}"


@pytest.mark.parametrize("path", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    missing = []
    for target in LINK.findall(path.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL, or an anchor in the same page
        file = target.split("#", 1)[0]
        if not (path.parent / file).exists():
            missing.append(target)
    assert not missing, f"{path.relative_to(ROOT)} links to files that do not exist: {missing}"


def test_every_make_target_in_the_readme_exists():
    targets = make_targets()
    assert {"sweep", "test", "ui", "venv"} <= targets  # the Makefile parse itself
    named = make_names(README.read_text())
    assert named, "no make command found in README.md's code blocks"
    assert named <= targets, f"README.md names make targets the Makefile lacks: {sorted(named - targets)}"


def test_every_isosweep_command_in_the_readme_parses(monkeypatch, capsys):
    found = isosweep_commands(README.read_text())
    assert found, "no isosweep command found in README.md's code blocks"
    for argv in found:
        assert parse(argv, monkeypatch, capsys).run is not None


def test_the_readme_verdicts_are_the_reports():
    # the README's summary is REPORT.md's table of claims and verdicts, row for row; `make report` regenerates that
    report = (ROOT / "dashboards" / "REPORT.md").read_text().splitlines()
    start = next(i for i, line in enumerate(report) if line.startswith("| claim |"))
    table = []
    for line in report[start:]:
        if not line.startswith("|"):
            break
        table.append(line)
    readme = README.read_text().splitlines()
    assert [line for line in table if line not in readme] == [], "README.md's verdicts differ from REPORT.md's"


def test_the_helpers_find_what_they_should():
    text = "```bash\nA=1 .venv/bin/isosweep sweep s.yaml --dry-run   # c\nssh h 'cd isosweep && make gpu-check'\n```\n"
    assert isosweep_commands(text) == [["sweep", "s.yaml", "--dry-run"]]
    assert make_names(text + "```\nmake ui   # make sure\n```\n") == {"gpu-check", "ui"}
    assert isosweep_commands("isosweep sweep outside.yaml\n") == []
    assert isosweep_commands("```\nthe winner's fit\n```\n") == []
    assert LINK.findall("![a](x.png) [b](y.md#z) [c](http://e)") == ["x.png", "y.md#z", "http://e"]
