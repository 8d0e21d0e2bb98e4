"""mkdocs hooks: the site holds the guides in docs/ and, as pages of their own, the repository's documents they link
(README.md as the home page, CONTRIBUTING.md, CHANGELOG.md, benchmarks' README, REPORT and NOTES, the launch files'
README, with the report's charts and the license). Links are written for the repository (GitHub renders them as
they are); here each is rewritten to where its target lands on the site. The API reference's parameter types, which
the docstrings write as transformers' do ("(`int`, *optional*)"), are shown as types in code.
"""

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File

REPOSITORY = Path(__file__).resolve().parents[2]
# repository path -> site path of the documents outside docs/ that the site holds
OUTSIDE = {
    "README.md": "index.md",
    "CONTRIBUTING.md": "CONTRIBUTING.md",
    "CHANGELOG.md": "CHANGELOG.md",
    "LICENSE": "LICENSE.txt",
    "benchmarks/README.md": "benchmarks/README.md",
    "benchmarks/REPORT.md": "benchmarks/REPORT.md",
    "benchmarks/NOTES.md": "benchmarks/NOTES.md",
    "configs/accelerate/README.md": "configs/accelerate/README.md",
}
LINK = re.compile(r"(\]\()([^)\s#]+)((?:#[^)\s]*)?\))")
HELD: dict[str, str] = {}  # repository path -> site path of every file outside docs/ the site holds, set by on_files


def charts() -> dict[str, str]:
    """The report's charts, at the same place beside it."""
    report = (REPOSITORY / "benchmarks" / "REPORT.md").read_text()
    return {f"benchmarks/{name}": f"benchmarks/{name}" for name in re.findall(r"\]\((charts/[^)]+\.png)\)", report)}


def on_files(files, config):
    HELD.clear()
    HELD.update({**OUTSIDE, **charts()})
    for repository_path, site_path in HELD.items():
        source = REPOSITORY / repository_path
        content = source.read_text() if site_path.endswith((".md", ".txt")) else source.read_bytes()
        files.append(File.generated(config, site_path, content=content))
    return files


def repository_path(site_path: str) -> str:
    """Where a site page's source lives in the repository."""
    inverse = {site: repository for repository, site in HELD.items()}
    return inverse.get(site_path, f"docs/{site_path}")


def site_path(path: str) -> str | None:
    """Where a repository file lands on the site; None for one the site does not hold."""
    if path in HELD:
        return HELD[path]
    return path.removeprefix("docs/") if path.startswith("docs/") else None


def on_page_markdown(markdown, page, config, files):
    here = repository_path(page.file.src_uri)

    def rewrite(match: re.Match) -> str:
        target = match.group(2)
        if re.match(r"[a-z]+:", target):  # an address
            return match.group(0)
        path = posixpath.normpath(posixpath.join(posixpath.dirname(here), target))
        landed = site_path(path)
        if landed is None:  # a file the site does not hold: left as it is, for the strict build to name
            return match.group(0)
        relative = posixpath.relpath(landed, posixpath.dirname(page.file.src_uri) or ".")
        return match.group(1) + relative + match.group(3)

    return LINK.sub(rewrite, markdown)


# A parameter's type as transformers' docstrings write it, "(`int`, *optional*)", shown by mkdocstrings as the raw
# text in one code span: rendered as the type in code and "optional" as a word.
DOCSTRING_TYPE = re.compile(r"<code>`([^`<]+)`(?: or `([^`<]+)`)?(, \*optional\*)?</code>")


def docstring_type(match: re.Match) -> str:
    types = " or ".join(f"<code>{name}</code>" for name in match.groups()[:2] if name)
    return types + (", optional" if match.group(3) else "")


def on_page_content(html, page, config, files):
    return DOCSTRING_TYPE.sub(docstring_type, html)
