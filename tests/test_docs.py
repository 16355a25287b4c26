"""The reference in ``platform/docs/``: the generated pages are current, and every page's links and named tests exist.

``configuration.md`` and ``cli.md`` are written by ``python -m isosweep.docs`` (:mod:`isosweep.docs`); a change to a
config field, its docstring or a command's help that is not followed by a regeneration fails here, with the diff.
The hand-written pages are checked for what breaks silently on a code host: a relative link to a file that moved, an
anchor to a heading that was renamed, a test that was renamed or removed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from isosweep import docs
from isosweep.cli import build_parser
from isosweep.spec.trial import TrialConfig
from isosweep.spec.yamlio import flatten

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "platform" / "docs").glob("*.md"))
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
TEST_REF = re.compile(r"tests/[\w/]+\.py(?:::\w+)?")


def prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code spans (a link there is an example, not a link)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(path: Path) -> set[str]:
    """The anchors a code host gives the headings of ``path`` (a repeated heading gets ``-1``, ``-2``, ...)."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    seen: dict[str, int] = {}
    out = set()
    for match in re.finditer(r"^#{1,6} +(.+?) *#*$", text, flags=re.M):
        base = docs.slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def test_the_generated_pages_are_what_the_code_gives_now():
    differ = docs.stale()
    assert not differ, ("out of date, run `python -m isosweep.docs`: "
                        + "\n".join(f"{name}\n" + "\n".join(diff[:30]) for name, diff in differ.items()))


def test_generation_is_deterministic_and_check_catches_a_stale_page(tmp_path):
    for name, make in docs.PAGES.items():
        (tmp_path / name).write_text(make())
    assert docs.stale(tmp_path) == {}
    page = tmp_path / "configuration.md"
    page.write_text(page.read_text().replace("`trainer.micro_batch`", "`trainer.microbatch`", 1))
    (tmp_path / "cli.md").unlink()
    assert sorted(docs.stale(tmp_path)) == ["cli.md", "configuration.md"]


def test_every_trial_key_and_every_command_is_in_the_reference():
    configuration = docs.configuration_page()
    keys = flatten(TrialConfig(budget=128).model_dump(mode="json"))
    missing = [key for key in keys if f"| `{key}` |" not in configuration]
    assert not missing, missing
    assert "| `trainer.micro_batch` | int or null | `null` | > 0 |" in configuration
    assert "| `rollout.engine` | string | `auto` | `auto`, `vllm`, `hf` |" in configuration
    cli = docs.cli_page()
    commands = next(a for a in build_parser()._actions if isinstance(a.choices, dict)).choices
    assert all(f"## `isosweep {name}`" in cli for name in commands)


def test_field_docstrings_are_read_from_the_source():
    from isosweep.spec.trial import TrainerConfig

    found = docs.field_docstrings(TrainerConfig)
    assert set(found) == set(TrainerConfig.model_fields)
    assert found["gradient_checkpointing"].startswith("Recompute each decoder layer's activations")


def test_slugs_are_a_code_hosts_anchors():
    assert docs.slug("## `isosweep sweep`".lstrip("# ")) == "isosweep-sweep"
    assert docs.slug("Memory: micro-batches, checkpointing, chunks, ZeRO") == \
        "memory-micro-batches-checkpointing-chunks-zero"
    assert docs.slug("The frontier, n\\*, P(best) and ties") == "the-frontier-n-pbest-and-ties"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page):
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading with that anchor in {file.name}")
    assert not broken, f"{page.name}: {broken}"


@pytest.mark.parametrize("page", [p for p in PAGES if p.name not in docs.PAGES], ids=lambda p: p.name)
def test_named_tests_exist(page):
    """In the hand-written pages (the generated ones quote the code's docstrings, whose references are the code's)."""
    missing = []
    for ref in sorted(set(TEST_REF.findall(page.read_text()))):
        path, _, name = ref.partition("::")
        source = ROOT / path
        if not source.exists():
            missing.append(f"{ref}: no such file")
        elif name and not re.search(rf"^def {name}\(", source.read_text(), re.M):
            missing.append(f"{ref}: no such test")
    assert not missing, f"{page.name}: {missing}"


def test_the_pages_the_index_promises_exist():
    index = (ROOT / "platform" / "docs" / "README.md").read_text()
    names = {"README.md", "concepts.md", "sweeps.md", "configuration.md", "cli.md", "mlflow.md", "hpo.md", "trial.md",
             "tasks.md", "reliability.md", "troubleshooting.md", "design.md"}
    assert names == {p.name for p in PAGES}
    assert all(f"]({name})" in index for name in names - {"README.md"})
