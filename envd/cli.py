"""The ``envd`` command line."""
from __future__ import annotations

import argparse
import sys

import envd


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="envd", description=envd.__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"envd {envd.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the env ids envd.make accepts")
    args = parser.parse_args(argv)
    if args.command == "list":
        for env_id in envd.list_envs():
            spec = envd.native.get_spec(env_id)
            params = ", ".join(p.describe() for p in spec.params) or "-"
            print(f"{env_id:<28} obs {spec.observation_space}  action {spec.action_space}  "
                  f"max_episode_steps={spec.max_episode_steps}  params: {params}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
