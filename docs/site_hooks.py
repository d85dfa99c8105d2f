"""mkdocs hooks of the documentation site (mkdocs.yml): README.md becomes the overview page
(docs/index.md is the short home page) and BENCHMARKS.md a page beside the docs; links are
rewritten to where their target is on the site.

The Markdown files are written to be read in the repository, where README links
``docs/backprop.md`` and backprop.md links ``../npformer/functional/linear.py``. On the site
README is ``overview.md`` at the root of the docs, so:

- a link to a file of docs/ (or to README/BENCHMARKS) points to its page;
- a link to another file of the repository (a source file) points to a page of the site that
  shows it (``source/PATH.md``, made here for each file the Markdown links), so that the link
  works wherever the site is read, offline too;
- a link to nothing is left as it is, so that ``mkdocs build --strict`` fails on it.

In the tutorials' pages (rendered from notebooks, HTML that mkdocs does not check), links to
``X.md`` and ``X.ipynb`` become links to the pages ``X.html``, and the loaders that nbconvert's
template writes into each notebook (MathJax 2 and mermaid, from a CDN) are taken out: the site's
own KaTeX renders the math (docs/javascripts/katex.js), and no page asks the network for anything.
"""
import os
import posixpath
import re
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = {"README.md": "overview.md", "BENCHMARKS.md": "benchmarks.md"}   # repository -> site
SOURCE = "source"                  # the site's folder of the repository files the docs link
LANGUAGES = {".py": "python", ".toml": "toml", ".cfg": "ini", ".yml": "yaml", ".json": "json"}
LINK = re.compile(r"\]\((?P<target>[^)\s#]+)(?P<anchor>#[^)\s]*)?\)")
HREF = re.compile(r'href="(?P<target>[^"#:]+)\.(?:md|ipynb)(?P<anchor>#[^"]*)?"')
# nbconvert's loaders: <script src=MATHJAX_URL> (empty here), its text/x-mathjax-config, and the
# module script that imports mermaid from a CDN when the notebook has a diagram
CDN_LOADERS = re.compile(r'<!-- Load mathjax -->\s*<script src="[^"]*">\s*</script>'
                         r'|<script type="text/x-mathjax-config">.*?</script>'
                         r'|<script type="module">(?:(?!</script>).)*?mermaid.*?</script>', re.S)


def on_files(files, config):
    for source, page in PAGES.items():
        files.append(File.generated(config, page,
                                    content=(ROOT / source).read_text(encoding="utf-8")))
    for relative in sorted(_linked_sources()):
        files.append(File.generated(config, f"{SOURCE}/{relative}.md",
                                    content=_source_page(relative)))
    return files


def _linked_sources():
    """The repository's files outside docs/ that README, BENCHMARKS and docs/ link."""
    found = set()
    for origin in [*(ROOT / source for source in PAGES), *sorted(DOCS.rglob("*.md"))]:
        for m in LINK.finditer(origin.read_text(encoding="utf-8")):
            real = _resolve(m.group("target"), origin)
            if real is not None and real.is_file() and not real.is_relative_to(DOCS):
                relative = real.relative_to(ROOT).as_posix()
                if relative not in PAGES:
                    found.add(relative)
    return found


def _source_page(relative):
    """A page showing the repository's file ``relative`` whole, as a code block."""
    code = (ROOT / relative).read_text(encoding="utf-8")
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", code)), default=0))
    language = LANGUAGES.get(Path(relative).suffix, "text")
    return f"# `{relative}`\n\n{fence}{language}\n{code}\n{fence}\n"


def _origin(src_uri):
    """Where the page's Markdown lies in the repository."""
    for source, page in PAGES.items():
        if src_uri == page:
            return ROOT / source
    return DOCS / src_uri


def _resolve(target, origin):
    """The repository path that the link ``target`` of the file ``origin`` names, or None for a
    link to another site or to nothing (which mkdocs --strict then names)."""
    if "://" in target or target.startswith("mailto:"):
        return None
    real = Path(os.path.normpath(origin.parent / target))
    return real if real.exists() and real.is_relative_to(ROOT) else None


def _site_target(target, origin, src_uri):
    """``target`` (as written in ``origin``) as a link of the page ``src_uri``, or None to keep it."""
    real = _resolve(target, origin)
    if real is None:
        return None
    relative = real.relative_to(ROOT).as_posix()
    if relative in PAGES:
        in_docs = PAGES[relative]
    elif real.is_relative_to(DOCS):
        in_docs = real.relative_to(DOCS).as_posix()
    elif real.is_file():
        in_docs = f"{SOURCE}/{relative}.md"      # a source file: its page (on_files)
    else:
        return None                              # a folder: mkdocs --strict names it
    return posixpath.relpath(in_docs, posixpath.dirname(src_uri) or ".")


def on_page_markdown(markdown, page, config, files):
    origin, src_uri = _origin(page.file.src_uri), page.file.src_uri
    if src_uri.startswith(f"{SOURCE}/"):
        return markdown                          # a source file's page: code, no links

    def fix(m):
        new = _site_target(m.group("target"), origin, src_uri)
        return m.group(0) if new is None else f"]({new}{m.group('anchor') or ''})"

    return LINK.sub(fix, markdown)


def on_page_content(html, page, config, files):
    if not page.file.src_uri.endswith(".ipynb"):
        return html
    if 'class="jp-Mermaid' in html:
        raise PluginError(f"{page.file.src_uri}: a mermaid diagram needs mermaid, which the site "
                          f"does not carry (it would load it from a CDN)")
    html = CDN_LOADERS.sub("", html)
    return HREF.sub(lambda m: f'href="{m.group("target")}.html{m.group("anchor") or ""}"', html)
