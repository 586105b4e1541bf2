"""Loading the daemon's ``--plugin`` libraries.

A path that names no file (a typo) stops the startup (StartupError, one
line).  A library that exists but fails to load (another ABI version, an
invalid definition, a duplicate env id) is logged and skipped: the daemon
serves the built-ins and the other plugins, and ``envd status`` lists what
failed and why, so one broken library never takes a shared daemon down.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

from envd.errors import PluginError
from envd.native.registry import load_plugin
from envd.server.config import StartupError

log = logging.getLogger("envd.server")


def load_plugins(paths: Iterable[str]) -> list[dict[str, Any]]:
    """Load each plugin in order; one entry per path for `envd status`:
    {"path", "envs": [ids]} or {"path", "error": message}."""
    report: list[dict[str, Any]] = []
    for path in map(os.path.abspath, paths):
        if not os.path.isfile(path):
            raise StartupError(f"--plugin {path} (ENVD_PLUGINS): no such file")
        try:
            ids = load_plugin(path)
        except PluginError as e:
            log.error("%s; serving without it", e)
            report.append({"path": path, "error": str(e)})
        else:
            log.info("plugin %s: %s", path, ", ".join(ids))
            report.append({"path": path, "envs": ids})
    return report
