"""The ``envd`` command line.

    envd --threads 8          start the daemon (flags: envd --help)
    envd list [--json]        env ids envd.make and the daemon accept (with the
                              daemon's --plugin flags: their envs too)
    envd list --endpoint [ENDPOINT] [--json] [--timeout S] [--server-key --client-key]
                              the envs a running daemon can make
    envd status [--endpoint] [--json] [--server-key FILE --client-key FILE]
                              ask a running daemon how it is doing
    envd keygen [--out DIR] [--name NAME]
                              write a CURVE key pair (DIR/NAME.key, DIR/NAME.key_secret)
    envd bench [--quick] [--out DIR] [--seconds S] [--rounds R] [--sizes N ...]
               [--learner-envs N]
                              the performance comparison on this machine (envd.tools.bench)
    envd bench --python [--quick] [--out DIR] [--seconds S] [--rounds R] [--num-envs N]
                              hosted Python envs against gymnasium, PufferLib and SB3
                              (envd.tools.bench_python)
    envd bench --ocean [ENV,ENV] [--quick] [--sizes N ...] [--out DIR]
                              PufferLib's Ocean envs: envd against PufferLib's
                              serial loop (envd.tools.bench_ocean)
    envd ocean build [--source PATH] [--cache DIR] [ENV ...]
                              build PufferLib's Ocean envs (envd.tools.ocean_cli)

``python -m envd`` runs the same (src/envd/__main__.py).  Output cut short by its
reader (``envd status --json | head``) ends the command quietly, as Unix tools
do: exit status 141 (128 + SIGPIPE), no traceback.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import textwrap
from typing import TYPE_CHECKING, Any

import numpy as np
import zmq
from gymnasium import spaces

import envd

if TYPE_CHECKING:
    from envd.native.registry import EnvSpec


#: Width of `envd list`'s lines.
LIST_WIDTH = 100
#: Box bounds are spelled out element by element up to this many elements.
_BOUNDS_SHOWN = 8


def _list(plugins: tuple[str, ...], as_json: bool = False, ocean_envs: tuple[str, ...] = (),
          ocean_cache: str | None = None) -> int:
    """Print every env (after loading plugins and --ocean envs); exit 1 when
    one fails."""
    status = 0
    for path in plugins:
        try:
            envd.load_plugin(path)
        except envd.PluginError as exc:
            print(f"envd list: {exc}", file=sys.stderr)
            status = 1
    if ocean_envs:
        from envd.native.ocean_ids import load_for_daemon
        for entry in load_for_daemon(ocean_envs, ocean_cache):
            if "error" in entry:
                print(f"envd list: {entry['error']}", file=sys.stderr)
                status = 1
    _print_envs([envd.native.get_spec(env_id) for env_id in envd.list_envs()], as_json)
    return status


def _print_envs(specs: list[EnvSpec], as_json: bool) -> None:
    """`envd list`'s output: JSON, or each env's lines (env_lines)."""
    if as_json:
        print(json.dumps([env_description(spec) for spec in specs], indent=2, allow_nan=False))
    else:
        print("\n\n".join("\n".join(env_lines(spec)) for spec in specs))


def _remote_list(endpoint: str | None, timeout: float, as_json: bool,
                 server_key: str | None = None, client_key: str | None = None) -> int:
    """Print every env a running daemon can make (its built-ins, plugins and
    allowed Python envs); exit 1 when it does not answer."""
    try:
        with envd.connect(endpoint, timeout=timeout, server_key=server_key,
                          client_key=client_key) as client:
            if isinstance(client, envd.MultiClient):
                described = _envs_on_every_daemon(client)
            else:
                described = client.describe_envs()
    except envd.EnvdError as exc:
        print(f"envd list: {exc}", file=sys.stderr)
        return 1
    _print_envs([spec_from_wire(env) for env in described], as_json)
    return 0


def _envs_on_every_daemon(multi: envd.MultiClient) -> list[dict[str, Any]]:
    """The envs every daemon of a MultiClient can make (what its make can
    spread), described as the first daemon describes them; a line on stderr
    names the envs only some daemons serve."""
    per_daemon = [client.describe_envs() for client in multi.clients]
    if not per_daemon:
        return []
    common = set.intersection(*({env["id"] for env in envs} for envs in per_daemon))
    partial = sorted({env["id"] for envs in per_daemon for env in envs} - common)
    if partial:
        print(f"envd list: not on every one of the {len(per_daemon)} daemons, so left out: "
              f"{', '.join(partial)}", file=sys.stderr)
    return [env for env in per_daemon[0] if env["id"] in common]


def spec_from_wire(env: dict[str, Any]) -> EnvSpec:
    """An env of a daemon's list_envs reply as an EnvSpec (no definition)."""
    from envd import protocol
    from envd.native.registry import EnvSpec, InfoFieldSpec, ParamSpec
    return EnvSpec(
        id=env["id"], observation_space=protocol.space_from_wire(env["observation_space"]),
        action_space=protocol.space_from_wire(env["action_space"]),
        max_episode_steps=env.get("max_episode_steps"), num_agents=env.get("num_agents", 1),
        params=tuple(ParamSpec(p["name"], p["type"], p["default"], p["min"], p["max"], p["doc"])
                     for p in env.get("params", ())),
        info_fields=tuple(InfoFieldSpec(f["name"], tuple(f["shape"]), np.dtype(f["dtype"]),
                                        f["doc"]) for f in env.get("info_fields", ())),
        definition=None, origin=env.get("origin", "builtin"))


def _source(spec: EnvSpec) -> str:
    """builtin, python (a daemon's hosted Python env) or plugin."""
    return spec.origin if spec.origin in ("builtin", "python") else "plugin"


def _json_number(value: float | int | bool) -> float | int | bool | None:
    """A bound or default as JSON has it: null for an infinite bound (unbounded)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _param_bound(kind: str, value: float) -> float | int | None:
    """A parameter's bound as JSON has it: an int parameter's as an int
    (2147483647, not 2147483647.0), null where unbounded."""
    if kind == "int" and math.isfinite(value):
        return int(value)
    return _json_number(value)


def _bounds(array: np.ndarray) -> Any:
    """A Box's low or high: one number when every element has it, else the
    nested list; ints for integer dtypes; null where unbounded."""
    values = array.astype(np.float64) if array.dtype.kind == "f" else array.astype(np.int64)
    if values.size and (values == values.flat[0]).all():
        return _json_number(values.flat[0].item())
    nested = values.tolist()

    def clean(item: Any) -> Any:
        return [clean(x) for x in item] if isinstance(item, list) else _json_number(item)
    return clean(nested)


def space_description(space: spaces.Space) -> dict[str, Any]:
    """A space as JSON: {"type": "Discrete", "n", "start"}, {"type": "Box",
    "dtype", "shape", "low", "high"} (see `_bounds`), {"type": "MultiDiscrete",
    "dtype", "nvec", "start"} (nested lists of nvec's shape) or {"type":
    "MultiBinary", "shape"}; a Dict or Tuple (a hosted Python env's) as
    {"type": "Dict", "spaces": {key: ...}} or {"type": "Tuple", "spaces": [...]}."""
    if isinstance(space, spaces.Dict):
        return {"type": "Dict", "spaces": {key: space_description(sub)
                                           for key, sub in space.spaces.items()}}
    if isinstance(space, spaces.Tuple):
        return {"type": "Tuple", "spaces": [space_description(sub) for sub in space.spaces]}
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "dtype": space.dtype.name, "nvec": space.nvec.tolist(),
                "start": space.start.tolist()}
    if isinstance(space, spaces.MultiBinary):
        return {"type": "MultiBinary", "shape": list(space.shape)}
    assert isinstance(space, spaces.Box)
    return {"type": "Box", "dtype": space.dtype.name, "shape": list(space.shape),
            "low": _bounds(space.low), "high": _bounds(space.high)}


def env_description(spec: EnvSpec) -> dict[str, Any]:
    """What `envd list --json` prints about one env (an envd.native.EnvSpec)."""
    source = _source(spec)
    return {
        "id": spec.id,
        "source": source,
        "plugin": spec.origin if source == "plugin" else None,
        "observation_space": space_description(spec.observation_space),
        "action_space": space_description(spec.action_space),
        "max_episode_steps": spec.max_episode_steps,
        "num_agents": spec.num_agents,
        "params": [{"name": p.name, "type": p.type, "default": p.default,
                    "min": _param_bound(p.type, p.min_value),
                    "max": _param_bound(p.type, p.max_value),
                    "doc": p.doc} for p in spec.params],
        "info_fields": [{"name": f.name, "dtype": f.dtype.name, "shape": list(f.shape),
                         "doc": f.doc} for f in spec.info_fields],
        "render": ({"modes": spec.render_modes, "shape": list(spec.render_shape),
                    "fps": spec.render_fps} if spec.render_shape else None),
        # ABI 5: the spaces above are those at the defaults when they depend on
        # the params; an env that resets itself; its episode log's fields
        "describes": spec.describes,
        "resets_itself": spec.resets_itself,
        "episode_fields": list(spec.episode_fields),
    }


def _number(value: float) -> str:
    """A bound as written: an integer in full (2147483647, not 2.14748e+09)."""
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    return f"{value:.6g}"


def _space_text(space: spaces.Space) -> list[str]:
    """Discrete(2); Box(uint8, shape (84, 84)) in [0, 255]; or a small Box
    with its bounds element by element on two more lines (a large one with
    differing bounds points to --json)."""
    if not isinstance(space, spaces.Box):
        return [str(space)]
    head = f"Box({space.dtype.name}, shape {space.shape})"
    low, high = _bounds(space.low), _bounds(space.high)
    if not isinstance(low, list) and not isinstance(high, list):
        return [f"{head} in [{_number(space.low.flat[0])}, {_number(space.high.flat[0])}]"]
    if space.low.size > _BOUNDS_SHOWN:
        return [f"{head}, bounds differ per element (envd list --json)"]
    return [head] + [f"{name:<5}[{' '.join(_number(x) for x in bound.flat)}]"
                     for name, bound in (("low", space.low), ("high", space.high))]


def env_lines(spec: EnvSpec) -> list[str]:
    """`envd list`'s lines about one env, none wider than LIST_WIDTH: a heading
    (id, source, time limit), then labelled lines: the plugin's path, the
    spaces, each parameter and info field, wrapped under their label."""
    source = {"builtin": "built-in", "python": "hosted Python env"}.get(_source(spec), "plugin")
    limit = spec.max_episode_steps if spec.max_episode_steps is not None else "none"
    if spec.resets_itself:
        limit = "none (the env resets itself)"
    agents = f", {spec.num_agents} agents per env" if spec.num_agents > 1 else ""
    rows = [("plugin", spec.origin)] if _source(spec) == "plugin" else []
    for label, space in (("observation", spec.observation_space), ("action", spec.action_space)):
        first, *more = _space_text(space)
        rows += [(label, first)] + [("", line) for line in more]  # bounds under their space
    if spec.describes:
        rows.append(("", "(spaces at the default parameters: they depend on them)"))
    rows += [("parameter", p.describe() + (f": {p.doc}" if p.doc else "")) for p in spec.params]
    if spec.episode_fields:
        rows.append(("episode log", ", ".join(spec.episode_fields) + ' (info["envd_log"])'))
    rows += [("info", f"{f.name}: {f.dtype.name} {f.shape} per env"
              + (f": {f.doc}" if f.doc else "")) for f in spec.info_fields]
    if spec.render_shape:
        rows.append(("render", f"rgb_array, frames {spec.render_shape} uint8 at "
                               f"{spec.render_fps} fps"))
    # Words break at spaces only, never at the hyphens of ids and paths; a
    # word longer than a line (a long plugin path) is cut where the line ends.
    lines = textwrap.wrap(f"{spec.id}  {source}, max_episode_steps {limit}{agents}",
                          LIST_WIDTH, subsequent_indent="    ", break_on_hyphens=False)
    label_width = max(len(label) for label, _ in rows) + 4
    for label, text in rows:
        lines += textwrap.wrap(text, LIST_WIDTH, initial_indent=f"  {label:<{label_width - 2}}",
                               subsequent_indent=" " * label_width, break_on_hyphens=False)
    return lines


def _keygen(out: str, name: str) -> int:
    """Write a key pair and say how to use it; exit 1 (nothing written) when a
    file of the pair exists."""
    from envd import keys

    try:
        public, secret = keys.generate(out, name)
    except (keys.KeyFileError, OSError) as exc:
        print(f"envd keygen: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {public} (public key, mode 0600: hand it to the other side)\n"
          f"wrote {secret} (secret key, mode 0600: keep it private, on this host only)\n"
          "\n"
          "For the daemon (tcp endpoints then admit only listed clients):\n"
          f"  envd --bind tcp://0.0.0.0:5555 --curve-secret-key {secret} "
          "--curve-allowed-clients CLIENT_KEYS_DIR\n"
          f"  and give {public} to the clients (their server_key).\n"
          "For a client:\n"
          f"  copy {public} into the daemon's --curve-allowed-clients directory and restart it;\n"
          '  envd.connect("tcp://HOST:5555", server_key="DAEMON.key", '
          f'client_key="{secret}")\n'
          f"  (or ENVD_SERVER_KEY=DAEMON.key ENVD_CLIENT_KEY={secret}; "
          "`envd status --server-key --client-key` too)")
    return 0


def _status(endpoint: str | None, timeout: float, as_json: bool,
            server_key: str | None = None, client_key: str | None = None) -> int:
    """Exit 0 with the daemon's status, 1 when it does not answer in time
    (usable as a container health check)."""
    try:
        with envd.connect(endpoint, timeout=timeout, server_key=server_key,
                          client_key=client_key) as client:
            status = client.status()
            endpoints = client.endpoints if isinstance(client, envd.MultiClient) else None
    except envd.EnvdError as exc:
        print(f"envd status: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(status, indent=2))
    elif isinstance(status, list):  # several daemons (a list or dns+tcp:// endpoint)
        print("\n\n".join(f"{where}\n{status_table(one)}"
                          for where, one in zip(endpoints or (), status)))
    else:
        print(status_table(status))
    return 0


def _bench(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from envd.tools import bench as benchmark
    from envd.tools import bench_teardown

    bench_teardown.install()  # a killed run leaves no daemon, process or folder
    if args.seconds is not None and args.seconds <= 0:
        parser.error("envd bench: --seconds must be > 0")
    if args.rounds is not None and args.rounds < 1:
        parser.error("envd bench: --rounds must be >= 1")
    if args.python and args.ocean is not None:
        parser.error("envd bench: --python and --ocean are separate runs")
    if args.python:
        return _bench_python(parser, args)
    if args.ocean is not None:
        return _bench_ocean(parser, args)
    if args.num_envs is not None:
        parser.error("envd bench: --num-envs is an option of --python")
    if args.bench_threads is not None and args.bench_threads < 1:
        parser.error("envd bench: --threads must be >= 1")
    if args.learner_envs is not None and (args.learner_envs < 2 or args.learner_envs % 2):
        parser.error("envd bench: --learner-envs must be even and >= 2 (batch N/2)")
    try:
        sizes = benchmark.parse_sizes(args.sizes) if args.sizes else None
    except ValueError as exc:
        parser.error(f"envd bench: {exc}")
    options = {"seconds": args.seconds, "rounds": args.rounds, "sizes": sizes,
               "threads": args.bench_threads, "out": args.out,
               "learner_envs": args.learner_envs,
               "progress": not args.no_progress}
    if args.quick:
        settings = benchmark.Settings.quick(**options)
    else:
        settings = benchmark.Settings(**{k: v for k, v in options.items() if v is not None})
    try:
        return benchmark.main(settings)
    except KeyboardInterrupt:
        print("envd bench: interrupted", file=sys.stderr)
        return 130


def _bench_ocean(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """envd bench --ocean: PufferLib's Ocean envs, envd against PufferLib's own loop."""
    from envd.tools import bench_ocean

    for flag, value in (("--threads", args.bench_threads), ("--learner-envs", args.learner_envs),
                        ("--num-envs", args.num_envs)):
        if value is not None:
            parser.error(f"envd bench: {flag} does not apply to --ocean")
    if args.sizes and min(args.sizes) < 1:
        parser.error("envd bench: --sizes must be >= 1")
    envs = tuple(e for e in args.ocean.split(",") if e and e != "all")
    options = {"seconds": args.seconds, "rounds": args.rounds, "envs": envs,
               "sizes": tuple(args.sizes or ()), "out": args.out,
               "progress": not args.no_progress}
    if args.quick:
        settings = bench_ocean.Settings.quick(**options)
    else:
        settings = bench_ocean.Settings(**{k: v for k, v in options.items() if v is not None})
    try:
        return bench_ocean.main(settings)
    except KeyboardInterrupt:
        print("envd bench: interrupted", file=sys.stderr)
        return 130


def _bench_python(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """envd bench --python: hosted Python envs against their peers."""
    from envd.tools import bench_python

    for flag, value in (("--sizes", args.sizes), ("--threads", args.bench_threads),
                        ("--learner-envs", args.learner_envs)):
        if value is not None:
            parser.error(f"envd bench: {flag} does not apply to --python")
    num_envs = args.num_envs
    if num_envs is not None:
        try:
            bench_python.check_num_envs(num_envs)
        except ValueError as exc:
            parser.error(f"envd bench: {exc}")
    options = {"seconds": args.seconds, "rounds": args.rounds, "num_envs": num_envs,
               "out": args.out, "progress": not args.no_progress}
    if args.quick:
        settings = bench_python.Settings.quick(**options)
    else:
        settings = bench_python.Settings(**{k: v for k, v in options.items() if v is not None})
    try:
        return bench_python.main(settings)
    except KeyboardInterrupt:
        print("envd bench: interrupted", file=sys.stderr)
        return 130


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
    session (env steps per second averaged over the session's life; THREADS:
    its make's max_threads, "all" when uncapped)."""
    uptime = max(status["uptime_s"], 1e-9)
    lines = [
        f"{status['server']}  pid {status['pid']} on {status['hostname']}  "
        f"up {_duration(uptime)}  threads {status['threads']}  "
        f"clients {status['clients']}  sessions {status['sessions']}  envs {status['envs']}"
        + (f"  workers {status['workers']}" if status.get("workers") else ""),
        f"env steps {_count(status['env_steps'])} ({_count(status['env_steps'] / uptime)}/s "
        f"on average)  shared memory {_count(status.get('shm_bytes', 0))}B  "
        f"env state {_count(status.get('state_bytes', 0))}B"
        + ("  tcp: CURVE" if status.get("curve") else "")
        + ("  DRAINING" if status.get("draining") else ""),
    ]
    failed = [p for p in status.get("plugins", []) if "error" in p]
    lines += [p["error"] for p in failed]  # each error names its plugin's path
    rows = status.get("session_table", [])
    if rows:
        lines.append("")
        lines.append(f"{'SESSION':<10}{'ENV ID':<26}{'NUM_ENVS':>9}{'BATCH':>8}"
                     f"{'THREADS':>8}{'WORKERS':>8}{'STEPS/S':>10}{'AGE':>9}")
        for row in rows:
            rate = row["env_steps"] / max(row["age_s"], 1e-9)
            cap = row.get("max_threads")  # (absent from an older daemon's rows)
            threads = "all" if cap is None else str(cap)
            agents = row.get("num_agents", 1)  # a multi-agent env: envs x agents (its rows)
            envs = f"{row['num_envs']}x{agents}" if agents > 1 else str(row["num_envs"])
            lines.append(f"{row['session']:<10}{row['env_id'][:25]:<26}{envs:>9}"
                         f"{row['batch_size']:>8}{threads:>8}{row.get('workers', 0):>8}"
                         f"{_count(rate):>10}"
                         f"{_duration(row['age_s']):>9}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run `envd ARGV`; its exit status."""
    try:
        try:
            return _main(argv)
        finally:  # buffered output meets a closed pipe here at the latest
            sys.stdout.flush()
    except BrokenPipeError:
        # The reader left (`envd status --json | head`): stop quietly, as a
        # Unix tool killed by SIGPIPE does.  stdout goes to /dev/null so that
        # the interpreter's own flush at exit finds nothing to fail on.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 128 + signal.SIGPIPE


def _add_key_arguments(parser: argparse.ArgumentParser) -> None:
    """A client subcommand's CURVE keys (envd status, envd list --endpoint)."""
    parser.add_argument("--server-key", metavar="FILE", help="a CURVE daemon's public .key "
                        "file or its 40-character text (default: ENVD_SERVER_KEY; tcp only)")
    parser.add_argument("--client-key", metavar="FILE", help="this client's .key_secret file, "
                        "whose .key is in the daemon's --curve-allowed-clients directory "
                        "(default: ENVD_CLIENT_KEY; tcp only)")


def _main(argv: list[str] | None) -> int:
    from envd.server import config as server_config  # the daemon's flags
    from envd.server.daemon import run_daemon
    from envd.tools.cli_parser import EnvdArgumentParser  # (no module-level envd.tools import)

    parser = EnvdArgumentParser(
        prog="envd", description="envd: an environment-stepping daemon for reinforcement "
        "learning. Without a command, run the daemon.")
    parser.add_argument("--version", action="version", version=f"envd {envd.__version__}")
    server_config.add_arguments(parser)
    sub = parser.add_subparsers(dest="command", metavar="{list,status,keygen,bench,ocean}")
    listing = sub.add_parser("list", help="list the env ids envd.make and the daemon accept "
                             "(and those of the --plugin libraries given before the command)")
    listing.add_argument("--json", action="store_true", help="print them as JSON: a list of "
                         "{id, source, plugin, observation_space, action_space, "
                         "max_episode_steps, num_agents, params, info_fields, render}")
    listing.add_argument("--endpoint", nargs="?", const="", metavar="ENDPOINT",
                         help="ask a running daemon instead: the envs it can make (its "
                         "built-ins, plugins and allowed Python envs); without a value the "
                         "default endpoint (ENVD_ENDPOINT, else the default ipc socket)")
    listing.add_argument("--timeout", type=float, default=5.0,
                         help="with --endpoint: seconds to wait (default 5)")
    _add_key_arguments(listing)
    status = sub.add_parser("status", help="print a running daemon's status (exit 1 if it "
                            "does not answer within the timeout)")
    status.add_argument("--endpoint", help="the daemon's endpoint (default: ENVD_ENDPOINT, "
                        "else the default ipc socket)")
    status.add_argument("--timeout", type=float, default=5.0, help="seconds to wait (default 5)")
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    _add_key_arguments(status)
    keygen = sub.add_parser("keygen", help="write a CURVE key pair: NAME.key (public) and "
                            "NAME.key_secret (secret), both mode 0600; never overwrites")
    keygen.add_argument("--out", metavar="DIR", default=".",
                        help="directory to write to, created with mode 0700 (default .)")
    keygen.add_argument("--name", default="envd", help="file name of the pair (default envd)")
    bench = sub.add_parser("bench", help="measure envd (in-process, daemon socket path, fast "
                           "path) against EnvPool and gymnasium on this machine: table, "
                           "targets, plot")
    bench.add_argument("--quick", action="store_true",
                       help="short measurements: the whole run takes under a minute")
    bench.add_argument("--out", metavar="DIR", help="directory for results.json, results.csv, "
                       "report.txt and steps_per_second.png (default ./envd-bench-<timestamp>)")
    bench.add_argument("--seconds", type=float, metavar="S",
                       help="seconds per measurement (default 0.3; --quick 0.03; with "
                       "--python 1, --quick 0.1)")
    bench.add_argument("--rounds", type=int, metavar="R",
                       help="rounds per configuration, interleaved; the median and spread "
                       "are reported (default 7; --quick 2; with --python 5)")
    bench.add_argument("--sizes", type=int, nargs="+", metavar="N",
                       help="num_envs values (default 1 64 1024 4096)")
    bench.add_argument("--threads", type=int, metavar="T", dest="bench_threads",
                       help="threads of the benchmark's 'auto' daemon (default: usable CPUs)")
    bench.add_argument("--learner-envs", type=int, metavar="N",
                       help="N of the async-with-learner comparison and of async over two "
                       "daemons, batch N/2 (even; default 4096; --quick 1024)")
    bench.add_argument("--python", action="store_true",
                       help="instead: gymnasium's Python Acrobot-v1 and CartPole-v1 hosted by "
                       "envd (in-process and through a daemon) against gymnasium's vector "
                       "envs, PufferLib, SB3 and the machine's parallel ceiling "
                       "(docs/benchmarks.md)")
    bench.add_argument("--ocean", nargs="?", const="all", metavar="ENV,ENV",
                       help="instead: PufferLib's Ocean envs (built by `envd ocean build`; "
                       "default every build) in envd against PufferLib's own serial loop, "
                       "at N=64 and the env's config N, or --sizes (docs/benchmarks.md)")
    bench.add_argument("--num-envs", type=int, metavar="N",
                       help="with --python: envs per system (even; default 16)")
    bench.add_argument("--no-progress", action="store_true",
                       help="no progress bar (it is shown only when stderr is a terminal)")
    from envd.tools import ocean_cli  # its parser; the build itself imports lazily too
    ocean_cli.add_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "ocean":
        return ocean_cli.run(args)
    if args.command == "status":
        return _status(args.endpoint, args.timeout, args.json, args.server_key, args.client_key)
    if args.command == "keygen":
        return _keygen(args.out, args.name)
    if args.command == "bench":
        return _bench(parser, args)
    if args.command == "list" and args.endpoint is not None:
        return _remote_list(args.endpoint or None, args.timeout, args.json, args.server_key,
                            args.client_key)
    if args.command == "list":
        # list binds nothing: a non-loopback ENVD_ENDPOINT (a trainer host's
        # remote daemon) must not stop it for want of CURVE keys.
        args.insecure = True
    try:
        config = server_config.from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    if args.command == "list":
        return _list(config.plugins, args.json, config.ocean_envs, config.ocean_cache)
    try:
        return run_daemon(config)
    except (RuntimeError, OSError, zmq.ZMQError, envd.EnvdError) as exc:  # e.g. the endpoint is taken
        print(f"envd: cannot start: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
