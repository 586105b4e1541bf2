"""mkdocs hook: publish the repository's top-level pages and keep every link working.

The site is built from docs/, whose pages are read on GitHub too and link to
files outside docs/ (``../SECURITY.md``, ``../README.md#benchmarks``,
``../src/envd/protocol.py``).  This hook adds README.md, SECURITY.md and
examples/README.md to the site as pages, and rewrites each page's links by
where they point in the repository: to a page of the site, or, for a module of
the package, to that module in the API reference (docs/api.md).  Any other link
is left as written, so ``mkdocs build --strict`` still fails on a broken one.
"""
from __future__ import annotations

import posixpath
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Repository files published as pages: repository path -> path in the site.
EXTRA_PAGES = {"README.md": "readme.md", "SECURITY.md": "security.md",
               "examples/README.md": "examples.md"}
#: Folders of the package and their import names (pyproject.toml's package-dir).
PACKAGE_DIRS = {"src/envd": "envd", "client": "envd.client", "server": "envd.server",
                "native": "envd.native"}
API_PAGE = "api.md"
#: An inline Markdown link's target: ](target) or ](target "title").
_LINK = re.compile(r"\]\(([^)\s]+)((?:\s+\"[^\"]*\")?)\)")
_EXTERNAL = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|#|/)")


def on_files(files, config):
    # Imported here: the link logic below is tested without mkdocs installed
    # (tests/packaging/test_docs_site_links.py).
    from mkdocs.structure.files import File
    for repo_path, site_path in EXTRA_PAGES.items():
        files.append(File.generated(config, site_path, abs_src_path=str(ROOT / repo_path)))
    return files


def _repository_path(site_path: str) -> str:
    """Where the page with this site path lives in the repository."""
    for repo_path, published in EXTRA_PAGES.items():
        if published == site_path:
            return repo_path
    return f"docs/{site_path}"


def _site_target(resolved: str) -> tuple[str, str | None] | None:
    """The site path (and anchor) a repository path is published at, or None."""
    if resolved.startswith("docs/"):
        return resolved[len("docs/"):], None
    if resolved in EXTRA_PAGES:
        return EXTRA_PAGES[resolved], None
    folder = next((f for f in PACKAGE_DIRS if resolved.startswith(f + "/")), None)
    if resolved.endswith(".py") and folder is not None:
        module = PACKAGE_DIRS[folder].split(".") + resolved[len(folder) + 1:].split("/")
        module[-1] = module[-1][:-len(".py")]
        if module[-1] == "__init__":
            module.pop()
        return API_PAGE, ".".join(module)
    return None


def rewrite_link(target: str, page_site_path: str) -> str:
    """The link target a page at page_site_path should use in the site."""
    if _EXTERNAL.match(target):
        return target
    path, _, anchor = target.partition("#")
    here = posixpath.dirname(_repository_path(page_site_path))
    resolved = posixpath.normpath(posixpath.join(here, path))
    site = _site_target(resolved)
    if site is None:
        return target  # not published: left as written for --strict to report
    site_path, module_anchor = site
    relative = posixpath.relpath(site_path, posixpath.dirname(page_site_path) or ".")
    anchor = module_anchor or anchor
    return relative + (f"#{anchor}" if anchor else "")


def on_page_markdown(markdown: str, page, config, files) -> str:
    site_path = page.file.src_uri
    return _LINK.sub(lambda m: f"]({rewrite_link(m.group(1), site_path)}{m.group(2)})", markdown)
