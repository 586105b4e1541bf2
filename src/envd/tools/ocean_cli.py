"""`envd ocean build`: build PufferLib's Ocean envs into the operator's cache."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    ocean = sub.add_parser("ocean", help="PufferLib's Ocean C envs (docs/ocean.md)")
    actions = ocean.add_subparsers(dest="ocean_command", metavar="{build}", required=True)
    build = actions.add_parser(
        "build", help="compile Ocean envs from PufferLib's own source into the build cache "
        "(never runs PufferLib's setup.py)")
    build.add_argument("envs", nargs="*", metavar="ENV",
                       help="envs to build (default: every env envd has a manifest for)")
    build.add_argument("--source", metavar="PATH",
                       help="a PufferLib tree (the folder holding pufferlib/) or its sdist "
                       "(default: ENVD_OCEAN_SOURCE, else pufferlib==3.0.0's sdist from the "
                       "package index, sha256 checked)")
    build.add_argument("--cache", metavar="DIR",
                       help="the build cache, a folder of this user's, mode 0700 (default: "
                       "ENVD_OCEAN_CACHE, else $XDG_CACHE_HOME/envd/ocean)")


def run(args: argparse.Namespace) -> int:
    """Build; print one line per env; exit 1 if any env failed."""
    from envd.native import ocean_build, ocean_source

    try:
        done, failed = ocean_build.build(args.envs, args.source,
                                         Path(args.cache) if args.cache else None)
    except (ocean_build.OceanBuildError, ocean_source.OceanSourceError) as exc:
        print(f"envd ocean build: {exc}", file=sys.stderr)
        return 1
    for build in done:
        print(f"{build.env}: built {build.library}")
    for message in failed.values():
        print(message, file=sys.stderr)
    return 1 if failed else 0
