"""``envd bench --ocean``: PufferLib's Ocean envs, envd against PufferLib's
own serial loop, side by side (docs/benchmarks.md, "Ocean envs").

For each env built in the Ocean cache (``envd ocean build``) and each N (64
and the env's own config size, ``[env] num_envs`` of
``pufferlib/config/ocean/<env>.ini`` in the same PufferLib tree), in
interleaved rounds (bench_rounds), agent steps per second of:

- **PufferLib serial**: PufferLib's own binding of the env, compiled from
  the same source as PufferLib compiles it (envd.native.ocean_reference):
  ``vec_init`` of N envs, then per step the actions copied into its action
  array and one ``vec_step`` -- the loop PufferLib's Serial backend runs;
- **PufferLib Multiprocessing** (2 workers): pufferlib-core's
  ``Multiprocessing`` backend over PufferLib's own env class and binding
  (bench_ocean_mp.py), else n/a and the error it raised;
- **envd serial / 2 threads / auto**: ``envd.make("puffer:<env>", N,
  num_threads=0 / 2 / None)`` and ``step(actions)``;
- **envd in-place**: the auto env stepped in PufferLib's shape of call
  (docs/ocean.md): the actions copied into ``env.actions``, then
  ``env.step_in_place()`` (no info dict, no tuple);
- **envd daemon**: ``client.make`` on a private daemon started with
  ``--ocean`` (its default threads), over shared memory;
- **envd daemon, 1 thread**: the same on a second daemon started with
  ``--threads 1``: against envd serial in-process, the like-for-like
  comparison of DESIGN §14 (a 2-CPU host has no CPU for more daemon threads
  next to the daemon's serving thread and the trainer).

Every system steps the same pre-drawn batches of actions (the C action type
for PufferLib's binding).  A ratio is taken round by round against PufferLib
serial (the daemon's one thread: against envd serial).  Then the pair: a
cheap Ocean env next to a CPU-deep one in one daemon (PAIR; bench_pair.py),
the cheap one capped at ``max_threads=PAIR_CAP`` or not, both stepping at
once from two client processes.  Tests run it in --quick mode and never
assert speed.
"""
from __future__ import annotations

import configparser
import contextlib
import dataclasses
import functools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

import envd
from envd.native.registry import get_spec
from envd.tools import bench_load, bench_pair, bench_teardown
from envd.tools.bench import Unavailable, _jsonable, machine_info, steps_per_second, timed_steps
from envd.tools.bench_ocean_mp import PufferMultiprocessingRun
from envd.tools.bench_rounds import interleaved_rounds, judge, paired_ratios, ratio_text, spread_text

PUFFER_SERIAL = "PufferLib serial"
PUFFER_MP = "PufferLib Multiprocessing, 2 workers"
SERIAL = "envd serial"
TWO_THREADS = "envd 2 threads"
AUTO = "envd auto"
IN_PLACE = "envd in-place"
DAEMON = "envd daemon"
DAEMON_ONE = "envd daemon, 1 thread"
SYSTEMS = (PUFFER_SERIAL, PUFFER_MP, SERIAL, TWO_THREADS, AUTO, IN_PLACE, DAEMON, DAEMON_ONE)
#: The columns given as a ratio to PufferLib serial.
RATIOS = (SERIAL, TWO_THREADS, AUTO, IN_PLACE, DAEMON, PUFFER_MP)
#: Further per-round ratios: name -> (numerator, denominator).
OTHER_RATIOS = {"auto / PufferLib MP": (AUTO, PUFFER_MP),
                "daemon 1 thread / serial": (DAEMON_ONE, SERIAL),
                "auto / serial": (AUTO, SERIAL),
                "in-place / auto": (IN_PLACE, AUTO),
                "2 threads / serial": (TWO_THREADS, SERIAL)}
#: Ratios of the CPU time per agent step (all of this process's threads), a
#: measure that other processes' load leaves alone: of scaling (1.0 is ideal,
#: spinning or waiting threads raise it), and of envd's cost per agent step
#: against PufferLib serial's where every step runs on the calling thread.
CPU_RATIOS = {"CPU 2 threads / serial": (TWO_THREADS, SERIAL),
              "CPU auto / serial": (AUTO, SERIAL),
              "CPU auto / PufferLib": (AUTO, PUFFER_SERIAL),
              "CPU in-place / PufferLib": (IN_PLACE, PUFFER_SERIAL)}
IN_PROCESS = (PUFFER_SERIAL, SERIAL, TWO_THREADS, AUTO, IN_PLACE)
#: Width of a column of the printed tables.
WIDTH = 26
#: Distinct batches of actions, cycled.
ACTION_BATCHES = 8
SMALL_N = 64
#: envs the 2-thread target names (issue 36: CPU-deep ones).
TWO_THREAD_ENVS = ("go", "enduro")
#: The pair (issue 36): a cheap Ocean env next to a CPU-deep one in one daemon,
#: the cheap one capped at max_threads=PAIR_CAP (one pool thread, as the
#: seed's max_num_threads) or uncapped.  Measured when both are in the run.
PAIR = ("pong", "go")
PAIR_CAP = 1


@dataclasses.dataclass
class Settings:
    """One run's knobs (``envd bench --ocean``)."""

    envs: tuple[str, ...] = ()         # empty: every env built
    sizes: tuple[int, ...] = ()        # empty: 64 and each env's config N
    seconds: float = 0.5
    rounds: int = 5
    out: str | None = None
    source: str | None = None          # PufferLib tree or sdist (else ENVD_OCEAN_SOURCE)
    progress: bool = True

    @classmethod
    def quick(cls, **overrides: Any) -> Settings:
        """Short measurements at N=8 (unless sizes are given)."""
        values = {"seconds": 0.05, "rounds": 2, "sizes": (8,),
                  **{k: v for k, v in overrides.items() if v is not None and v != ()}}
        return cls(**values)


# ---- what to measure ----------------------------------------------------------------------
def config_num_envs(tree: Path, env: str) -> int | None:
    """``[env] num_envs`` of PufferLib's config of env in a PufferLib tree
    (or its ``pufferlib`` folder), or None without one."""
    paths = [base / "config" / "ocean" / f"{env}.ini" for base in (tree / "pufferlib", tree)]
    parser = configparser.ConfigParser()
    try:
        parser.read_string(next(p for p in paths if p.is_file()).read_text())
        return int(parser["env"]["num_envs"].strip())
    except (StopIteration, OSError, KeyError, ValueError, configparser.Error):
        return None


def plugin_facts(library: Path, params: Sequence[float]) -> tuple[dict[str, float], np.dtype]:
    """The C kwargs of params and the C action dtype of an Ocean build."""
    import cffi

    from envd.native.registry import DTYPES

    ffi = cffi.FFI()
    ffi.cdef("int envd_ocean_ckwargs(const double *params, const char **names, double *values,"
             " int32_t cap); int envd_ocean_action_dtype(void);")
    lib: Any = ffi.dlopen(str(library))  # (its functions: the cdef above)
    names, values = ffi.new("const char *[64]"), ffi.new("double[64]")
    n = lib.envd_ocean_ckwargs(ffi.new("double[]", list(params) or [0.0]), names, values, 64)
    if n < 0:
        raise RuntimeError(f"{library}: envd_ocean_ckwargs failed ({n})")
    ckwargs = {os.fsdecode(ffi.string(names[i])): values[i] for i in range(n)}
    return ckwargs, np.dtype(DTYPES[lib.envd_ocean_action_dtype()])


def action_batches(space: Any, seed: int = 0) -> list[np.ndarray]:
    """ACTION_BATCHES batches of a vec's action space, drawn before any clock."""
    space.seed(seed)
    return [np.asarray(space.sample()) for _ in range(ACTION_BATCHES)]


class Cycle:
    """step(): one step of a stepping function over the batches in turn."""

    def __init__(self, step: Callable[[np.ndarray], object], batches: list[np.ndarray]):
        self._step, self._batches, self._k = step, batches, 0

    def __call__(self) -> None:
        self._step(self._batches[self._k])
        self._k = (self._k + 1) % len(self._batches)


class PufferSerialRun:
    """PufferLib's binding: vec_init of num_envs envs, vec_step per step."""

    def __init__(self, binding: Any, ckwargs: dict[str, float], num_envs: int, rows: int,
                 obs_space: Any, act_dtype: np.dtype, batches: list[np.ndarray]):
        self.binding, self.rows = binding, rows
        self.cpu_ns: list[float] = []  # per round: CPU time per agent step
        self.obs = np.zeros((rows, *obs_space.shape), obs_space.dtype)
        shape = batches[0].shape
        self.acts = np.zeros(shape if len(shape) > 1 else (rows,), act_dtype)
        self.rewards = np.zeros(rows, np.float32)
        self.terminals = np.zeros(rows, np.bool_)
        self.truncations = np.zeros(rows, np.bool_)
        self.handle = binding.vec_init(self.obs, self.acts, self.rewards, self.terminals,
                                       self.truncations, num_envs, 0, **ckwargs)
        binding.vec_reset(self.handle, 0)
        self.batches = [b.reshape(self.acts.shape).astype(act_dtype) for b in batches]

        def step(actions: np.ndarray) -> None:
            self.acts[...] = actions
            binding.vec_step(self.handle)

        self.step = Cycle(step, self.batches)

    def rate(self, seconds: float) -> float:
        rate, cpu = timed_steps(self.step, self.rows, seconds)
        self.cpu_ns.append(cpu)
        return rate

    def close(self) -> None:
        if self.handle is not None:
            self.binding.vec_close(self.handle)
            self.handle = None


class VecRun:
    """An envd vector env (in-process or a daemon's): reset(seed=0), then
    step(actions) over the pre-drawn batches (in_place: each batch copied
    into env.actions, then env.step_in_place(), PufferLib's loop).
    In-process, it also records the CPU time per agent step of each round
    (cpu_ns)."""

    def __init__(self, env: Any, batches: list[np.ndarray], in_process: bool = True,
                 in_place: bool = False):
        self.env, self.rows, self.in_process = env, env.num_envs, in_process
        self.cpu_ns: list[float] = []
        env.reset(seed=0)
        if not in_place:
            self.step = Cycle(env.step, batches)
            return
        buffer, step_in_place = env.actions, env.step_in_place

        def step(actions: np.ndarray) -> None:
            buffer[...] = actions
            step_in_place()

        self.step = Cycle(step, batches)

    def rate(self, seconds: float) -> float:
        if not self.in_process:  # this process's CPU time is not the daemon's
            return steps_per_second(self.step, self.rows, seconds)
        rate, cpu = timed_steps(self.step, self.rows, seconds)
        self.cpu_ns.append(cpu)
        return rate

    def dispatch(self) -> dict[str, Any] | None:
        """An in-process vec's threads and how its steps ran (the native
        vec's counts of inline and pooled steps, and the wall time per env of
        a step each way that it chose between, ns: 0 for a way never
        measured); None for a daemon's."""
        stats = getattr(self.env, "dispatch_stats", None)
        if stats is None:
            return None
        found = stats()
        return {"num_threads": self.env.num_threads, "inline_steps": found["inline_jobs"],
                "pooled_steps": found["pooled_jobs"],
                "inline_step_ns": found["inline_step_ns_per_env"],
                "pooled_step_ns": found["pooled_step_ns_per_env"]}

    def close(self) -> None:
        self.env.close()


# ---- the daemons --------------------------------------------------------------------------
@contextlib.contextmanager
def ocean_daemon(envs: Sequence[str], cache: Path, threads: int | None = None) -> Iterator[Any]:
    """A private daemon serving envs (``--ocean``) from the Ocean cache
    `cache`, with `threads` pool threads (None: its default)."""
    from envd.tools.bench_python import hosting_daemon

    args = ("--ocean", ",".join(envs), "--ocean-cache", str(cache))
    with hosting_daemon((), threads=threads, extra_args=args) as client:
        yield client


def start_daemon(stack: contextlib.ExitStack, envs: Sequence[str], cache: Path,
                 threads: int | None) -> Any:
    """A client of ocean_daemon(envs, cache, threads) entered on stack, or
    None when it does not start (its columns then say so)."""
    try:
        return stack.enter_context(ocean_daemon(envs, cache, threads))
    except RuntimeError:
        return None


# ---- the run ------------------------------------------------------------------------------
class OceanBench:
    """One run of ``envd bench --ocean``."""

    def __init__(self, settings: Settings, out: TextIO | None = None):
        self.settings = settings
        self.out = sys.stdout if out is None else out
        self.scratch = Path(tempfile.gettempdir())  # run() makes a private one

    def log(self, text: str) -> None:
        if self.settings.progress:
            print(text, file=sys.stderr, flush=True)

    def measure(self, env: str, n: int, binding: Any, library: Path,
                clients: dict[str, Any], reference: tuple[Path, Path]) -> dict[str, Any]:
        """Every system on env at N=n, interleaved rounds.  clients: system
        (DAEMON, DAEMON_ONE) -> a client of its daemon, or None;
        reference: the PufferLib tree's ocean dir and the path of the built
        binding (for the Multiprocessing child)."""
        env_id = f"puffer:{env}"
        spec = get_spec(env_id)
        ckwargs, act_dtype = plugin_facts(library, [p.default for p in spec.params])
        runs: dict[str, Any] = {}
        missing: dict[str, str] = {}
        rows = 0
        try:
            serial = envd.make(env_id, n, seed=0, num_threads=0)
            batches = action_batches(serial.action_space)
            runs[SERIAL] = VecRun(serial, batches)
            rows = serial.num_envs
            runs[PUFFER_SERIAL] = PufferSerialRun(binding, ckwargs, n, rows,
                                                  serial.single_observation_space, act_dtype,
                                                  batches)
            runs[TWO_THREADS] = VecRun(envd.make(env_id, n, seed=0, num_threads=2), batches)
            runs[AUTO] = VecRun(envd.make(env_id, n, seed=0), batches)
            runs[IN_PLACE] = VecRun(envd.make(env_id, n, seed=0), batches, in_place=True)
            for system, client in clients.items():
                if client is None:
                    missing[system] = "the daemon did not start"
                    continue
                try:
                    runs[system] = VecRun(client.make(env_id, n, seed=0), batches,
                                          in_process=False)
                except envd.EnvdError as exc:  # e.g. its cache lacks the build
                    missing[system] = f"the daemon refused the make: {exc}"
            try:
                ocean, built = reference
                runs[PUFFER_MP] = PufferMultiprocessingRun(ocean, env, built, n, batches,
                                                           self.scratch)
            except RuntimeError as exc:
                missing[PUFFER_MP] = str(exc)
            values = interleaved_rounds(
                list(runs), self.settings.rounds,
                lambda system, _r: runs[system].rate(self.settings.seconds))
            auto = runs[AUTO].dispatch()
            two_threads = runs[TWO_THREADS].dispatch()
            cpu = {s: list(run.cpu_ns) for s, run in runs.items() if getattr(run, "cpu_ns", None)}
        finally:
            # every run closed even if one's close raises; the last made
            # (PufferLib Multiprocessing, whose workers must not outlive the
            # benchmark) first
            with contextlib.ExitStack() as closing:
                for run in runs.values():
                    closing.callback(run.close)
        ratios = {s: paired_ratios(values[s], values[PUFFER_SERIAL])
                  for s in RATIOS if s in values}
        ratios.update({name: paired_ratios(values[a], values[b])
                       for name, (a, b) in OTHER_RATIOS.items() if a in values and b in values})
        ratios.update({name: paired_ratios(cpu[a], cpu[b])
                       for name, (a, b) in CPU_RATIOS.items() if a in cpu and b in cpu})
        return {"env": env, "num_envs": n, "rows": rows, "rates": values, "cpu_ns": cpu,
                "missing": missing, "ratios": ratios, "auto": auto, "two_threads": two_threads}

    def measure_pair(self, daemon: Any, configs: Sequence[tuple[str, int]]) -> dict[str, Any]:
        """The pair (PAIR) on the daemon at the largest N of each env in the
        run; {"missing": why} when it cannot be measured."""
        cheap, deep = PAIR
        sizes = {env: max((n for e, n in configs if e == env), default=0) for env in PAIR}
        if not all(sizes.values()):
            return {"missing": f"needs {cheap} and {deep} in the run"}
        if daemon is None:
            return {"missing": "the daemon did not start"}
        self.log(f"measuring the pair {cheap} x{sizes[cheap]} + {deep} x{sizes[deep]}")
        pair = bench_pair.Pair(cheap=(f"puffer:{cheap}", sizes[cheap]),
                               heavy=(f"puffer:{deep}", sizes[deep]), cap=PAIR_CAP)
        try:
            return bench_pair.run(daemon.endpoint, self.settings.rounds,
                                  self.settings.seconds, pair=pair)
        except RuntimeError as exc:
            return {"missing": str(exc)}

    def run(self) -> dict[str, Any]:
        from envd.native import ocean_build, ocean_ids, ocean_reference, ocean_source

        s = self.settings
        cache = ocean_build.default_cache()
        builds = ocean_build.installed_builds()
        envs = list(s.envs) or sorted(builds)
        unknown = [e for e in envs if e not in builds]
        if unknown:
            raise Unavailable(f"no Ocean build of {', '.join(unknown)}: run "
                              f"`envd ocean build {' '.join(unknown)}` first")
        tree = ocean_source.resolve(s.source, ocean_build.check_private_dir(cache))
        before = bench_load.sample()
        machine = machine_info()
        configs: list[tuple[str, int]] = []
        for env in envs:
            sizes: list[int | None] = list(s.sizes) or [SMALL_N, config_num_envs(tree, env)]
            for n in dict.fromkeys(x for x in sizes if x):
                configs.append((env, n))
        results = []
        with contextlib.ExitStack() as stack:
            self.scratch = Path(stack.enter_context(
                bench_teardown.temporary_folder("envd-bench-ocean-")))
            clients = {DAEMON: start_daemon(stack, envs, cache, None),
                       DAEMON_ONE: start_daemon(stack, envs, cache, 1)}
            for env in envs:
                ocean_ids.ensure_loaded(f"puffer:{env}")
                self.log(f"building PufferLib's binding of {env}")
                try:
                    built = ocean_reference.build(env, tree, cache)
                    binding = ocean_reference.load(built)
                except (RuntimeError, OSError, ImportError) as exc:
                    raise Unavailable(f"PufferLib's own binding of {env}: {exc}") from None
                reference = (ocean_source.ocean_dir(tree), built)
                for env_name, n in configs:
                    if env_name != env:
                        continue
                    self.log(f"measuring {env} at N={n}")
                    results.append(self.measure(env, n, binding, builds[env], clients,
                                                reference))
            pair = self.measure_pair(clients[DAEMON], configs)
        after = bench_load.sample()
        load = None
        if before is not None and after is not None:
            load = bench_load.assess(before, after, machine["usable_cpus"])
        return {"machine": machine, "settings": dataclasses.asdict(s), "results": results,
                "load": None if load is None else dataclasses.asdict(load),
                "load_warning": None if load is None or not load.loaded
                else bench_load.warning_text(load.reasons),
                "pair": bench_pair.summary(pair) if "missing" not in pair else pair,
                "targets": targets(results) + bench_pair.targets(
                    {} if "missing" in pair else pair)}


def targets(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 36's lines: envd auto >= 0.95x PufferLib serial everywhere (and
    the same line for its in-place step, PufferLib's shape of call);
    envd auto ahead of PufferLib Multiprocessing everywhere; the daemon's one
    thread >= 0.9x envd serial in-process everywhere (DESIGN §14); envd auto
    never slower than envd serial (>= 0.95x: its inline steps are serial's, so
    equal within the rounds' spread is the expected verdict there); 2 threads
    >= 1.6x PufferLib serial for go and enduro at their config N (the larger
    N).  (The pair's line is bench_pair.targets'.)"""
    lines = []
    per_row = ((AUTO, "envd auto / PufferLib serial", 0.95),
               (IN_PLACE, "envd in-place / PufferLib serial", 0.95),
               ("auto / PufferLib MP", "envd auto / PufferLib Multiprocessing",
                1.0),
               ("daemon 1 thread / serial", "envd daemon, 1 thread / envd serial "
                "(like for like)", 0.9),
               ("auto / serial", "envd auto / envd serial", 0.95))
    for key, name, limit in per_row:
        for r in results:
            lines.append({"target": f"{r['env']} N={r['num_envs']}: {name}",
                          "op": ">=", "limit": limit,
                          **judge(r["ratios"].get(key), ">=", limit)})
    largest = {}
    for r in results:
        if r["env"] in TWO_THREAD_ENVS and r["num_envs"] > SMALL_N:
            largest[r["env"]] = r
    for env, r in largest.items():
        lines.append({"target": f"{env} N={r['num_envs']}: envd 2 threads / PufferLib serial",
                      "op": ">=", "limit": 1.6,
                      **judge(r["ratios"].get(TWO_THREADS), ">=", 1.6)})
    return lines


# ---- the report ---------------------------------------------------------------------------
def report_text(r: dict[str, Any]) -> str:
    m, s = r["machine"], r["settings"]
    lines = [f"CPU: {m['cpu']}, {m['usable_cpus']} usable CPUs; load average before "
             f"{m['load_average'][0]}", f"envd {m['versions']['envd']}, "
             f"{s['rounds']} interleaved rounds of {s['seconds']} s",
             r["load_warning"] or "machine load: quiet", "",
             "agent steps per second (median ±half the min-max range over rounds)"]

    def table(columns: Sequence[str], cell: Callable[[dict[str, Any], str], str],
              names: Sequence[str] | None = None) -> None:
        """A row per result: env, N, then cell(result, column) per column."""
        lines.append(f"{'env':<12}{'N':>6}  " +
                     "".join(f"{c:>{WIDTH}}" for c in names or columns))
        for x in r["results"]:
            lines.append(f"{x['env']:<12}{x['num_envs']:>6}  " +
                         "".join(f"{cell(x, c):>{WIDTH}}" for c in columns))

    table(SYSTEMS, lambda x, c: spread_text(x["rates"][c]) if c in x["rates"] else "n/a",
          [PUFFER_SERIAL, "PufferLib MP, 2 workers", *SYSTEMS[2:]])
    lines += ["", "ratios, per round (median ±half range); to PufferLib serial, and others"]

    def ratio_cell(x: dict[str, Any], c: str) -> str:
        return ratio_text(x["ratios"][c]) if x["ratios"].get(c) else "n/a"

    table(RATIOS, ratio_cell, [*(f"{c.removeprefix('envd ')} / PufferLib" for c in RATIOS[:5]),
                               "PufferLib MP / PufferLib"])
    lines.append("")
    table(tuple(OTHER_RATIOS), ratio_cell)
    lines += ["", "CPU time per agent step, ns (all threads of the benchmark's process; "
                  "in-process systems)"]
    table((*IN_PROCESS, *CPU_RATIOS),
          lambda x, c: (ratio_cell(x, c) if c in CPU_RATIOS else
                        spread_text(x["cpu_ns"][c], lambda v: f"{v:.0f}")
                        if x.get("cpu_ns", {}).get(c) else "n/a"))
    for key, system in (("auto", "envd auto (num_threads=None)"),
                        ("two_threads", "envd 2 threads (num_threads=2)")):
        lines += ["", f"what {system} ran: threads, steps inline / pooled; a step's wall "
                      "time per env as last measured inline / pooled (ns; 0: never)"]
        for x in r["results"]:
            a = x.get(key)
            lines.append(f"{x['env']:<12}{x['num_envs']:>6}  " + (
                "n/a" if not a else f"{a['num_threads']} thread(s), {a['inline_steps']} inline "
                                    f"/ {a['pooled_steps']} pooled; {a['inline_step_ns']:.1f} "
                                    f"/ {a['pooled_step_ns']:.1f} ns"))
    missing = dict.fromkeys((system, why) for x in r["results"]
                            for system, why in x["missing"].items())
    lines += [f"{system}: n/a: {why}" for system, why in missing]
    pair = r.get("pair") or {}
    lines += ["", f"the pair: {PAIR[0]} next to {PAIR[1]} in one daemon, both stepping at "
                  "once (env steps/s)"]
    lines += (bench_pair.report_lines(pair) if "missing" not in pair
              else [f"  not measured: {pair.get('missing', 'not run')}"])
    lines += ["", "targets"]
    for t in r["targets"]:
        value = ("n/a" if t["value"] is None else t["detail"] if "detail" in t
                 else f"{t['value']:.2f}x ±{t['spread']:.2f}")
        lines.append(f"  {t['status']:<11}{t['target']} {t['op']} {t['limit']}: {value}")
    return "\n".join(lines) + "\n"


def _ratio_cell(result: dict[str, Any], column: str) -> str:
    return ratio_text(result["ratios"][column]) if result["ratios"].get(column) else "n/a"


def _rate_cell(result: dict[str, Any], column: str) -> str:
    return spread_text(result["rates"][column]) if column in result["rates"] else "n/a"


def markdown_table(r: dict[str, Any]) -> str:
    """The README's table: rates of PufferLib serial and envd auto, every
    envd column's ratio to PufferLib serial (the in-place step's too),
    PufferLib Multiprocessing's rate, envd auto's ratio to it and the
    daemon's one thread's to envd serial, with spread."""
    head = ("| env | N | PufferLib serial | envd auto | auto / PufferLib "
            "| in-place / PufferLib | serial / PufferLib "
            "| 2 threads / PufferLib | daemon / PufferLib | PufferLib MP, 2 workers "
            "| auto / PufferLib MP | daemon 1 thread / envd serial |")
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for x in r["results"]:
        ratio = functools.partial(_ratio_cell, x)
        rate = functools.partial(_rate_cell, x)
        lines.append(f"| {x['env']} | {x['num_envs']} | {spread_text(x['rates'][PUFFER_SERIAL])} "
                     f"| {spread_text(x['rates'][AUTO])} | {ratio(AUTO)} | {ratio(IN_PLACE)} "
                     f"| {ratio(SERIAL)} | {ratio(TWO_THREADS)} | {ratio(DAEMON)} "
                     f"| {rate(PUFFER_MP)} | {ratio('auto / PufferLib MP')} "
                     f"| {ratio('daemon 1 thread / serial')} |")
    return "\n".join(lines) + "\n"


def main(settings: Settings, stdout: TextIO | None = None) -> int:
    """Run, print the report, write report.txt, results.json and table.md."""
    out = sys.stdout if stdout is None else stdout
    try:
        result = OceanBench(settings, out).run()
    except Unavailable as exc:
        print(f"envd bench --ocean: {exc}", file=sys.stderr)
        return 1
    text = report_text(result)
    out.write(text)
    folder = Path(settings.out or f"envd-bench-ocean-{time.strftime('%Y%m%d-%H%M%S')}")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.txt").write_text(text)
    (folder / "table.md").write_text(markdown_table(result))
    (folder / "results.json").write_text(json.dumps(_jsonable(result), indent=1))
    print(f"results in {folder}{os.sep}", file=out)
    return 0

