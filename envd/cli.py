"""The ``envd`` command line.

    envd --threads 8          start the daemon (flags: envd --help)
    envd list                 env ids envd.make and the daemon accept (with the
                              daemon's --plugin flags: their envs too)
    envd status [--endpoint] [--json]  ask a running daemon how it is doing
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


def _status(endpoint: str | None, timeout: float, as_json: bool) -> int:
    """Exit 0 with the daemon's status, 1 when it does not answer in time
    (usable as a container health check)."""
    try:
        with envd.connect(endpoint, timeout=timeout) as client:
            status = client.status()
    except envd.EnvdError as exc:
        print(f"envd status: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(status, indent=2) if as_json else status_table(status))
    return 0


def _count(n: float) -> str:
    """1234567 -> '1.23M'."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.3g}" if isinstance(n, float) else str(n)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def status_table(status: dict) -> str:
    """The human view of a status reply: a summary line, then one row per
    session (env steps per second averaged over the session's life)."""
    uptime = max(status["uptime_s"], 1e-9)
    lines = [
        f"{status['server']}  pid {status['pid']} on {status['hostname']}  "
        f"up {_duration(uptime)}  threads {status['threads']}  "
        f"clients {status['clients']}  sessions {status['sessions']}  envs {status['envs']}",
        f"env steps {_count(status['env_steps'])} ({_count(status['env_steps'] / uptime)}/s "
        f"on average)  shared memory {_count(status.get('shm_bytes', 0))}B"
        + ("  DRAINING" if status.get("draining") else ""),
    ]
    failed = [p for p in status.get("plugins", []) if "error" in p]
    lines += [f"plugin {p['path']}: {p['error']}" for p in failed]
    rows = status.get("session_table", [])
    if rows:
        lines.append("")
        lines.append(f"{'SESSION':<10}{'ENV ID':<26}{'NUM_ENVS':>9}{'BATCH':>8}"
                     f"{'STEPS/S':>10}{'AGE':>9}")
        for row in rows:
            rate = row["env_steps"] / max(row["age_s"], 1e-9)
            lines.append(f"{row['session']:<10}{row['env_id'][:25]:<26}{row['num_envs']:>9}"
                         f"{row['batch_size']:>8}{_count(rate):>10}{_duration(row['age_s']):>9}")
    return "\n".join(lines)


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
    status = sub.add_parser("status", help="print a running daemon's status (exit 1 if it "
                            "does not answer within the timeout)")
    status.add_argument("--endpoint", help="the daemon's endpoint (default: ENVD_ENDPOINT, "
                        "else the default ipc socket)")
    status.add_argument("--timeout", type=float, default=5.0, help="seconds to wait (default 5)")
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    args = parser.parse_args(argv)
    if args.command == "status":
        return _status(args.endpoint, args.timeout, args.json)
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
