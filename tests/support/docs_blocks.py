"""The code blocks of the documentation (``docs/**/*.md``), as the docs harness
(``tests/e2e/test_docs_blocks.py``) runs them.

Every ```python and ```bash block is code a reader may run; ```text (output) and
```yaml (configuration) are not. A block runs as written, with substitutions that
stand for the reader's machine: a path under ``/mnt/`` lives in the test's temporary
directory, ``s3://my-bucket/...`` is moto's S3 server (its credentials and endpoint
added to the URI), ``http://head:8265`` is the address of the suite's head node's
dashboard (its job server and State API), and a command runs against the suite's
cluster.

What a fragment leaves to the reader (a training loop, a model) comes from
``tests.support.docs_snippets``, named by an HTML comment on the line before the
block (invisible in the rendered page)::

    <!-- docs-test: with=train_loop_per_worker then=fit_dcp_loop -->
    <!-- docs-test: inside=in_train_worker -->
    <!-- docs-test: files=train.py then=deployed_run -->

``with`` runs snippets before the block, ``then`` after it (in its namespace: after a
bash block, ``DOCS_STDOUT`` holds what it printed), ``inside`` puts the block in a
snippet's ``{block}`` (the body of a Train loop), and ``files`` writes the page's
blocks that name themselves so on their first line (``# train.py``), each with its
own ``with`` snippets before it, into the directory a bash block runs in: the script
that ``ray job submit`` sends is the page's own (and runs there, not on its own as
well). No block is skipped. A bash block
whose lines install the package (``git clone``, ``cd``, ``pip install``) is checked
against the README's install block and ``pyproject.toml``'s extras (CI runs those in
fresh environments).
"""

from __future__ import annotations

import re
import shlex
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.procs import REPO_ROOT

DOCS = Path(REPO_ROOT) / "docs"
#: The languages that are code to run.
RUN = ("python", "bash")
_FENCE = re.compile(
    r"(?:^<!-- docs-test: (?P<marker>[^\n]*?) -->\n)?^```(?P<lang>[a-z]*)\n(?P<body>.*?)^```",
    re.M | re.S,
)
_S3 = re.compile(r"s3://my-bucket/(?P<prefix>[^\s\"'?]*)(?:\?[^\s\"']*)?")
#: The address a page gives the head node's dashboard (``ray job submit --address``).
DASHBOARD = "http://head:8265"


@dataclass(frozen=True)
class Block:
    """One code block: its page, line, language, code and marker's settings."""

    page: str
    line: int
    lang: str
    code: str
    marker: dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def snippets_before(self) -> list[str]:
        return [n for n in self.marker.get("with", "").split(",") if n]

    @property
    def snippets_after(self) -> list[str]:
        return [n for n in self.marker.get("then", "").split(",") if n]

    @property
    def files(self) -> list[str]:
        return [n for n in self.marker.get("files", "").split(",") if n]

    @property
    def file_name(self) -> str | None:
        """The file it is, if its first line names one (``# train.py``)."""
        m = re.match(r"# ([\w.-]+\.\w+)\n", self.code)
        return m.group(1) if m else None


def parse_marker(text: str | None) -> dict[str, str]:
    """``with=a,b skip="a reason"`` as ``{"with": "a,b", "skip": "a reason"}``."""
    if not text:
        return {}
    return dict(word.split("=", 1) for word in shlex.split(text))


def blocks(root: Path = DOCS) -> list[Block]:
    """Every code block to run, page by page, in page order."""
    found = []
    for page in sorted(root.rglob("*.md")):
        text = page.read_text()
        for m in _FENCE.finditer(text):
            if m.group("lang") in RUN:
                line = text[: m.start("lang")].count("\n") + 1
                rel = str(page.relative_to(root.parent))
                marker = parse_marker(m.group("marker"))
                found.append(Block(rel, line, m.group("lang"), m.group("body"), marker))
    return found


def page_file(found: list[Block], page: str, name: str) -> Block:
    """The block of ``page`` that is the file ``name`` (its first line says so)."""
    named = [b for b in found if b.page == page and b.file_name == name]
    assert len(named) == 1, f"{page}: {len(named)} blocks start with '# {name}'"
    return named[0]


def localized(code: str, tmp: Path, s3_uri: object, dashboard: str = DASHBOARD) -> str:
    """``code`` on the test's machine: ``/mnt/`` under ``tmp``, ``s3://my-bucket/P``
    as ``s3_uri("my-bucket", P)``, the head node's dashboard at ``dashboard``."""
    code = code.replace("/mnt/", f"{tmp}/mnt/").replace(DASHBOARD, dashboard)
    return _S3.sub(lambda m: s3_uri("my-bucket", m.group("prefix")), code)  # type: ignore[operator]


def inside(template: str, code: str) -> str:
    """``code`` put where ``template`` says ``{block}`` (at that line's indentation)."""
    [line] = [x for x in template.splitlines() if x.strip() == "{block}"]
    indent = line[: len(line) - len(line.lstrip())]
    return template.replace(line, textwrap.indent(code, indent).rstrip("\n"))


def is_install(line: str) -> bool:
    words = shlex.split(line, comments=True)
    return words[:2] in (["pip", "install"], ["git", "clone"]) or words[:1] == ["cd"]
