"""Every relative link of README.md and docs/**.md resolves: the file (or folder) exists beside the
linking file, and an anchor names a heading of the target as GitHub spells it. The README stays a
front page of at most 400 lines."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(?!`).+?(?<!`)\1(?!`)", re.S)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text: markup dropped, lowercase, punctuation but '-' and '_'
    dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of ``page``; a repeated one also as GitHub's ``-1``, ``-2`` ..."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            out.add(base if base not in seen else f"{base}-{seen[base]}")
            seen[base] = seen.get(base, 0) + 1
    return out


def links(page: Path) -> list[str]:
    """The link targets of ``page`` outside fenced code and code spans (a code span in a link's text
    becomes plain text)."""
    text = CODE_SPAN.sub("code", FENCE.sub("", page.read_text()))
    return LINK.findall(text)


def broken(page: Path) -> list[str]:
    """``target (why)`` for each relative link of ``page`` that does not resolve."""
    bad = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http(s), mailto, ...
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            bad.append(f"{target} (no such file)")
        elif anchor and (file.suffix != ".md" or anchor not in anchors(file)):
            bad.append(f"{target} (no heading '{anchor}' there)")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert broken(page) == []


def test_the_check_sees_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# Going to a GPU, a real backbone\n\n## The study bed (`--env lopd-bed`)\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#going-to-a-gpu-a-real-backbone) [ok](a.md#the-study-bed---env-lopd-bed) "
                    "[web](https://example.com/x.md) `[code](nowhere.md)`\n[gone](c.md) [bad](a.md#going-to-a-gpu)\n"
                    "```\n[fenced](nowhere.md)\n```\n")
    assert broken(page) == ["c.md (no such file)", "a.md#going-to-a-gpu (no heading 'going-to-a-gpu' there)"]


def test_slugs_follow_github():
    assert slug("Quickstart (`make demo`)") == "quickstart-make-demo"
    assert slug("The five stages (and `report`, `export`, `store`)") == "the-five-stages-and-report-export-store"
    assert slug("Comparing methods: `lopd study`") == "comparing-methods-lopd-study"
    assert slug("max_len & the `--J` flag") == "max_len--the---j-flag"


def test_the_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 400, f"README.md has {lines} lines; move reference text to docs/"
