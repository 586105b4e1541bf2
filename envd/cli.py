"""The ``envd`` command line.

    envd --threads 8          start the daemon (flags: envd --help)
    envd list                 env ids envd.make and the daemon accept (with the
                              daemon's --plugin flags: their envs too)
    envd status [--endpoint]  ask a running daemon how it is doing
"""
from __future__ import annotations

import argparse
import json
import sys

import envd


def _list(plugins: tuple[str, ...]) -> int:
    status = 0
    for path in plugins:
        try:
            envd.load_plugin(path)
        except envd.PluginError as exc:
            print(f"envd list: {exc}", file=sys.stderr)
            status = 1
    for env_id in envd.list_envs():
        spec = envd.native.get_spec(env_id)
        params = ", ".join(p.describe() for p in spec.params) or "-"
        print(f"{env_id:<28} obs {spec.observation_space}  action {spec.action_space}  "
              f"max_episode_steps={spec.max_episode_steps}  params: {params}")
    return status


def _status(endpoint: str | None, timeout: float) -> int:
    try:
        with envd.connect(endpoint, timeout=timeout) as client:
            print(json.dumps(client.status(), indent=2))
    except envd.EnvdError as exc:
        print(f"envd status: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    from envd.server import config as server_config  # the daemon's flags
    from envd.server.daemon import run_daemon

    parser = argparse.ArgumentParser(
        prog="envd", description="envd: an environment-stepping daemon for reinforcement "
        "learning. Without a command, run the daemon.")
    parser.add_argument("--version", action="version", version=f"envd {envd.__version__}")
    server_config.add_arguments(parser)
    sub = parser.add_subparsers(dest="command", metavar="{list,status}")
    sub.add_parser("list", help="list the env ids envd.make and the daemon accept (and those "
                   "of the --plugin libraries given before the command)")
    status = sub.add_parser("status", help="print a running daemon's status as JSON")
    status.add_argument("--endpoint", help="the daemon's endpoint (default: ENVD_ENDPOINT, "
                        "else the default ipc socket)")
    status.add_argument("--timeout", type=float, default=5.0, help="seconds to wait (default 5)")
    args = parser.parse_args(argv)
    if args.command == "status":
        return _status(args.endpoint, args.timeout)
    try:
        config = server_config.from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    if args.command == "list":
        return _list(config.plugins)
    try:
        return run_daemon(config)
    except (RuntimeError, OSError, envd.EnvdError) as exc:  # e.g. the endpoint is taken
        print(f"envd: cannot start: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
