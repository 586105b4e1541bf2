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
- **PufferLib Multiprocessing** (2 workers) when pufferlib-core is
  importable, else n/a and why;
- **envd serial / 2 threads / auto**: ``envd.make("puffer:<env>", N,
  num_threads=0 / 2 / None)`` and ``step(actions)``;
- **envd daemon**: ``client.make`` on a private daemon started with
  ``--ocean`` (its default threads), over shared memory.

Every system steps the same pre-drawn batches of actions (the C action type
for PufferLib's binding).  A ratio is taken round by round against PufferLib
serial.  Tests run it in --quick mode and never assert speed.
"""
from __future__ import annotations

import configparser
import contextlib
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

import envd
from envd.native.registry import get_spec
from envd.tools import bench_load
from envd.tools.bench import Unavailable, _jsonable, machine_info, steps_per_second
from envd.tools.bench_rounds import interleaved_rounds, judge, paired_ratios, ratio_text, spread_text

PUFFER_SERIAL = "PufferLib serial"
PUFFER_MP = "PufferLib Multiprocessing, 2 workers"
SERIAL = "envd serial"
TWO_THREADS = "envd 2 threads"
AUTO = "envd auto"
DAEMON = "envd daemon"
SYSTEMS = (PUFFER_SERIAL, PUFFER_MP, SERIAL, TWO_THREADS, AUTO, DAEMON)
#: The columns given as a ratio to PufferLib serial.
RATIOS = (SERIAL, TWO_THREADS, AUTO, DAEMON, PUFFER_MP)
#: Distinct batches of actions, cycled.
ACTION_BATCHES = 8
SMALL_N = 64
#: envs the 2-thread target names (issue 36: CPU-deep ones).
TWO_THREAD_ENVS = ("go", "enduro")


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
    lib = ffi.dlopen(str(library))
    names, values = ffi.new("const char *[64]"), ffi.new("double[64]")
    n = lib.envd_ocean_ckwargs(ffi.new("double[]", list(params) or [0.0]), names, values, 64)
    if n < 0:
        raise RuntimeError(f"{library}: envd_ocean_ckwargs failed ({n})")
    ckwargs = {ffi.string(names[i]).decode(): values[i] for i in range(n)}
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
        return steps_per_second(self.step, self.rows, seconds)

    def close(self) -> None:
        if self.handle is not None:
            self.binding.vec_close(self.handle)
            self.handle = None


class VecRun:
    """An envd vector env (in-process or a daemon's): reset(seed=0), then
    step(actions) over the pre-drawn batches."""

    def __init__(self, env: Any, batches: list[np.ndarray]):
        self.env, self.rows = env, env.num_envs
        env.reset(seed=0)
        self.step = Cycle(env.step, batches)

    def rate(self, seconds: float) -> float:
        return steps_per_second(self.step, self.rows, seconds)

    def close(self) -> None:
        self.env.close()


def puffer_multiprocessing_unavailable() -> str:
    """Why the PufferLib Multiprocessing column is not measured."""
    try:
        import pufferlib.vector  # noqa: F401
    except Exception as exc:  # noqa: BLE001  (ImportError, or a broken build)
        return (f"pufferlib-core is not importable ({type(exc).__name__}; pufferlib-core "
                "3.0.23 requires torch==2.9.0 with CUDA, which would replace a CPU torch)")
    return ("pufferlib-core's Multiprocessing backend needs PufferLib's own Ocean "
            "package built in place; not measured by this benchmark")


# ---- the daemon ---------------------------------------------------------------------------
@contextlib.contextmanager
def ocean_daemon(envs: Sequence[str], cache: Path) -> Iterator[Any]:
    """A private daemon serving envs (``--ocean``) from the Ocean cache
    `cache`, with its default threads."""
    from envd.tools.bench_python import hosting_daemon

    args = ("--ocean", ",".join(envs), "--ocean-cache", str(cache))
    with hosting_daemon((), threads=None, extra_args=args) as client:
        yield client


# ---- the run ------------------------------------------------------------------------------
class OceanBench:
    """One run of ``envd bench --ocean``."""

    def __init__(self, settings: Settings, out: TextIO | None = None):
        self.settings = settings
        self.out = sys.stdout if out is None else out

    def log(self, text: str) -> None:
        if self.settings.progress:
            print(text, file=sys.stderr, flush=True)

    def measure(self, env: str, n: int, binding: Any, library: Path,
                client: Any) -> dict[str, Any]:
        """Every system on env at N=n, interleaved rounds."""
        env_id = f"puffer:{env}"
        spec = get_spec(env_id)
        ckwargs, act_dtype = plugin_facts(library, [p.default for p in spec.params])
        runs: dict[str, Any] = {}
        missing: dict[str, str] = {PUFFER_MP: puffer_multiprocessing_unavailable()}
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
            if client is None:
                missing[DAEMON] = "the daemon did not start"
            else:
                try:
                    runs[DAEMON] = VecRun(client.make(env_id, n, seed=0), batches)
                except envd.EnvdError as exc:  # e.g. its cache lacks the build
                    missing[DAEMON] = f"the daemon refused the make: {exc}"
            values = interleaved_rounds(
                list(runs), self.settings.rounds,
                lambda system, _r: runs[system].rate(self.settings.seconds))
        finally:
            for run in runs.values():
                run.close()
        return {"env": env, "num_envs": n, "rows": rows, "rates": values,
                "missing": missing,
                "ratios": {s: paired_ratios(values[s], values[PUFFER_SERIAL])
                           for s in RATIOS if s in values}}

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
            sizes = list(s.sizes) or [SMALL_N, config_num_envs(tree, env)]
            for n in dict.fromkeys(x for x in sizes if x):
                configs.append((env, n))
        results = []
        with contextlib.ExitStack() as stack:
            try:
                client = stack.enter_context(ocean_daemon(envs, cache))
            except RuntimeError:
                client = None
            for env in envs:
                ocean_ids.ensure_loaded(f"puffer:{env}")
                self.log(f"building PufferLib's binding of {env}")
                try:
                    binding = ocean_reference.load(ocean_reference.build(env, tree, cache))
                except (RuntimeError, OSError, ImportError) as exc:
                    raise Unavailable(f"PufferLib's own binding of {env}: {exc}") from None
                for env_name, n in configs:
                    if env_name != env:
                        continue
                    self.log(f"measuring {env} at N={n}")
                    results.append(self.measure(env, n, binding, builds[env], client))
        after = bench_load.sample()
        load = None
        if before is not None and after is not None:
            load = bench_load.assess(before, after, machine["usable_cpus"])
        return {"machine": machine, "settings": dataclasses.asdict(s), "results": results,
                "load": None if load is None else dataclasses.asdict(load),
                "load_warning": None if load is None or not load.loaded
                else bench_load.warning_text(load.reasons),
                "targets": targets(results)}


def targets(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 36's lines: envd auto >= 0.95x PufferLib serial everywhere; 2
    threads >= 1.6x for go and enduro at their config N (the larger N)."""
    lines = []
    for r in results:
        lines.append({"target": f"{r['env']} N={r['num_envs']}: envd auto / PufferLib serial",
                      "op": ">=", "limit": 0.95,
                      **judge(r["ratios"].get(AUTO), ">=", 0.95)})
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
    head = f"{'env':<12}{'N':>6}  " + "".join(f"{c:>18}" for c in
                                              (PUFFER_SERIAL, SERIAL, TWO_THREADS,
                                               AUTO, DAEMON))
    lines.append(head)
    for x in r["results"]:
        cells = [spread_text(x["rates"][c]) if c in x["rates"] else "n/a"
                 for c in (PUFFER_SERIAL, SERIAL, TWO_THREADS, AUTO, DAEMON)]
        lines.append(f"{x['env']:<12}{x['num_envs']:>6}  " + "".join(f"{c:>18}" for c in cells))
    lines += ["", "ratio to PufferLib serial (per-round ratios: median ±half range)"]
    lines.append(f"{'env':<12}{'N':>6}  " + "".join(f"{c:>18}" for c in RATIOS[:4]))
    for x in r["results"]:
        cells = [ratio_text(x["ratios"][c]) if x["ratios"].get(c) else "n/a"
                 for c in RATIOS[:4]]
        lines.append(f"{x['env']:<12}{x['num_envs']:>6}  " + "".join(f"{c:>18}" for c in cells))
    missing = dict.fromkeys((system, why) for x in r["results"]
                            for system, why in x["missing"].items())
    lines += [f"{system}: n/a: {why}" for system, why in missing]
    lines += ["", "targets"]
    for t in r["targets"]:
        value = "n/a" if t["value"] is None else f"{t['value']:.2f}x ±{t['spread']:.2f}"
        lines.append(f"  {t['status']:<11}{t['target']} {t['op']} {t['limit']}: {value}")
    return "\n".join(lines) + "\n"


def markdown_table(r: dict[str, Any]) -> str:
    """The README's table: rates of PufferLib serial and envd auto, and every
    envd column's ratio to PufferLib serial, with spread."""
    head = ("| env | N | PufferLib serial | envd auto | auto / PufferLib | serial / PufferLib "
            "| 2 threads / PufferLib | daemon / PufferLib |")
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for x in r["results"]:
        def ratio(c: str) -> str:
            return ratio_text(x["ratios"][c]) if x["ratios"].get(c) else "n/a"  # noqa: B023 -- called below
        lines.append(f"| {x['env']} | {x['num_envs']} | {spread_text(x['rates'][PUFFER_SERIAL])} "
                     f"| {spread_text(x['rates'][AUTO])} | {ratio(AUTO)} "
                     f"| {ratio(SERIAL)} | {ratio(TWO_THREADS)} | {ratio(DAEMON)} |")
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

