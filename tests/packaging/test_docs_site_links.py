"""The docs site's link mapping (docs/_hooks/repo_links.py): pages in docs/ link
to repository files outside it, which the site publishes elsewhere.  The site
itself is built with `mkdocs build --strict` in .ci/run; this checks the
mapping without mkdocs installed."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hook():
    spec = importlib.util.spec_from_file_location("repo_links", ROOT / "docs/_hooks/repo_links.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("page, target, expected", [
    ("configuration.md", "../SECURITY.md#curve-authentication-tcp", "security.md#curve-authentication-tcp"),
    ("troubleshooting.md", "../README.md#benchmarks", "readme.md#benchmarks"),
    ("protocol.md", "../src/envd/protocol.py", "api.md#envd.protocol"),
    ("architecture.md", "../src/envd/tools/cli.py", "api.md#envd.tools.cli"),
    ("architecture.md", "../client/connection.py", "api.md#envd.client.connection"),
    ("architecture.md", "../native/__init__.py", "api.md#envd.native"),
    ("metrics.md", "configuration.md#metrics", "configuration.md#metrics"),
    ("readme.md", "docs/deployment.md#how-these-files-are-checked", "deployment.md#how-these-files-are-checked"),
    ("readme.md", "SECURITY.md", "security.md"),
    ("readme.md", "examples/README.md", "examples.md"),
    ("readme.md", "docs/img/envd-bench-cartpole-2cpu.png", "img/envd-bench-cartpole-2cpu.png"),
    ("security.md", "#curve-authentication-tcp", "#curve-authentication-tcp"),
    ("index.md", "https://gymnasium.farama.org/", "https://gymnasium.farama.org/"),
    # not published: left as written, so that mkdocs --strict reports it
    ("architecture.md", "../tests/native/pool_stress.c", "../tests/native/pool_stress.c"),
    ("readme.md", "deploy/Dockerfile", "deploy/Dockerfile"),
])
def test_links_map_to_the_published_pages(hook, page, target, expected):
    assert hook.rewrite_link(target, page) == expected


def test_every_published_repository_page_exists(hook):
    for repo_path in hook.EXTRA_PAGES:
        assert (ROOT / repo_path).is_file(), repo_path
