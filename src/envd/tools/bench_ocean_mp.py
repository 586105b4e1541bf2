"""PufferLib's Multiprocessing backend over PufferLib's own Ocean env, for
``envd bench --ocean`` (its "PufferLib Multiprocessing, 2 workers" column).

PufferLib runs an Ocean env under Multiprocessing as
``pufferlib.vector.make(EnvClass, env_kwargs={"num_envs": n},
backend=Multiprocessing, num_envs=workers, num_workers=workers)``: each worker
process makes one instance of the env's own Python class over ``n`` C envs,
in the shared buffers, and the driver steps them all together.  The class
(``pufferlib/ocean/<env>/<env>.py`` of the PufferLib tree) imports
``pufferlib.ocean.<env>.binding``, which pufferlib-core does not ship: the
creator here puts PufferLib's own binding, compiled from the same tree
(envd.native.ocean_reference), at that name before it loads the class, in
whichever process calls it (the driver, and each worker however it was
started: the creator is a picklable partial of a module-level function).

It runs in a child process of the benchmark (``python -m
envd.tools.bench_ocean_mp``), which keeps PufferLib's ``pufferlib`` package
out of the benchmark's own modules (the Ocean tests load a different one
under that name) and its busy-waiting driver where PufferLib has it: a
process of its own.  The parent drives it over stdin/stdout, one line each
way: ``rate SECONDS`` answers agent steps per second; ``close`` ends it.
The first line the child writes is ``ready ROWS`` or ``error TEXT``.  The
child and PufferLib's workers form a process group of their own, killed
whole when the child does not answer within ANSWER_TIMEOUT_S (a worker that
crashed leaves PufferLib's driver spinning forever) or does not exit.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import select
import signal
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import numpy as np

WORKERS = 2
#: How long a PufferLib worker with nothing to do busy-waits (vector.py's
#: ``_worker_process``: 0.5 s), with a margin.
IDLE_SPIN_S = 0.6
#: How long the parent waits for a line of the child (beyond the measurement).
ANSWER_TIMEOUT_S = 120.0



def _module_from_file(name: str, path: Path, register: bool = False) -> types.ModuleType:
    """The module name executed from path (in sys.modules first if register:
    an env's module imports itself by name)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path} as {name}")
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

def _install_binding(ocean: Path, env: str, binding_path: Path) -> None:
    """Make ``pufferlib.ocean.<env>.binding`` importable: PufferLib's binding
    built at binding_path, under the env's folder of the tree's ocean dir."""
    import pufferlib

    name = f"pufferlib.ocean.{env}"
    if f"{name}.binding" in sys.modules:
        return
    if "pufferlib.ocean" not in sys.modules:
        package = types.ModuleType("pufferlib.ocean")
        package.__path__ = [str(ocean)]
        sys.modules["pufferlib.ocean"] = package
        pufferlib.ocean = package
    env_package = types.ModuleType(name)
    env_package.__path__ = [str(ocean / env)]
    binding = _module_from_file(f"{name}.binding", binding_path)
    env_package.binding = binding  # type: ignore[attr-defined]  # a module made here
    sys.modules[name] = env_package
    sys.modules[f"{name}.binding"] = binding


def env_class(ocean: Path, env: str, binding_path: Path) -> type:
    """PufferLib's own class of env (the ``pufferlib.PufferEnv`` subclass of
    ``<env>.py``), over the binding at binding_path."""
    import pufferlib

    _install_binding(ocean, env, binding_path)
    name = f"pufferlib.ocean.{env}.{env}"
    module = sys.modules.get(name)
    if module is None:
        module = _module_from_file(name, ocean / env / f"{env}.py", register=True)
    classes = [c for c in vars(module).values() if isinstance(c, type)
               and issubclass(c, pufferlib.PufferEnv) and c is not pufferlib.PufferEnv
               and c.__module__ == name]
    if not classes:
        raise RuntimeError(f"{env}.py defines no PufferEnv class")
    # The env's own class is the one named after it (pong.py also defines
    # CythonPong), else the first the file defines.
    named = [c for c in classes if c.__name__.lower() == env.replace("_", "").lower()]
    return (named or classes)[0]


def make_env(ocean: str, env: str, binding_path: str, **kwargs: Any) -> Any:
    """The creator PufferLib's vector.make calls (in the driver and in each
    worker): PufferLib's own class of env, made with kwargs."""
    return env_class(Path(ocean), env, Path(binding_path))(**kwargs)


def make_vec(ocean: Path, env: str, binding_path: Path, num_envs: int) -> Any:
    """PufferLib's Multiprocessing vec of num_envs C envs of env, WORKERS
    workers of num_envs // WORKERS envs each, all stepped together."""
    import pufferlib.vector

    if num_envs % WORKERS:
        raise ValueError(f"N={num_envs} is not a multiple of {WORKERS} workers")
    creator = functools.partial(make_env, str(ocean), env, str(binding_path))
    return pufferlib.vector.make(creator, env_kwargs={"num_envs": num_envs // WORKERS},
                                 backend=pufferlib.vector.Multiprocessing,
                                 num_envs=WORKERS, num_workers=WORKERS, overwork=True)


def _serve(ocean: Path, env: str, binding_path: Path, num_envs: int, batches_path: Path) -> None:
    """The child: make the vec, reset it (seed 0), then answer the parent."""
    from envd.tools.bench import steps_per_second

    # The answers go on a private copy of stdout; fd 1 becomes stderr, so
    # that what the env's C code or PufferLib's workers print never reaches
    # the parent's parser.
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        vec = make_vec(ocean, env, binding_path, num_envs)
    except Exception as exc:  # noqa: BLE001  (reported to the parent as the column's n/a)
        print(f"error {type(exc).__name__}: {exc}".replace("\n", " "), file=answers)
        return
    try:
        vec.async_reset(0)
        vec.recv()
        space = vec.action_space  # what its first send checks the actions against
        batches = [b.reshape(space.shape).astype(space.dtype) for b in np.load(batches_path)]
        state = {"k": 0}

        def step() -> None:
            vec.send(batches[state["k"]])
            vec.recv()
            state["k"] = (state["k"] + 1) % len(batches)

        print(f"ready {vec.num_envs}", file=answers)
        for line in sys.stdin:
            words = line.split()
            if words[:1] != ["rate"]:
                break
            rate = steps_per_second(step, vec.num_envs, float(words[1]))
            # PufferLib's idle workers spin for IDLE_SPIN_S before they poll
            # with sleeps: answer once they sleep, so that their spinning never
            # overlaps the benchmark's next measurement.
            time.sleep(IDLE_SPIN_S)
            print(rate, file=answers)
    finally:
        vec.close()


class PufferMultiprocessingRun:
    """The parent's end: a child process running PufferLib's Multiprocessing
    vec of env; ``rate(seconds)`` as the benchmark's other runs.
    RuntimeError, with the child's error, when it cannot run."""

    def __init__(self, ocean: Path, env: str, binding_path: Path, num_envs: int,
                 batches: list[np.ndarray], scratch: Path):
        batches_path = scratch / f"mp-actions-{env}-{num_envs}.npy"
        np.save(batches_path, np.stack(batches))
        self.stderr_path = scratch / f"mp-stderr-{env}-{num_envs}.txt"
        with open(self.stderr_path, "w") as stderr:  # a file: a full pipe would block it
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "envd.tools.bench_ocean_mp", str(ocean), env,
                 str(binding_path), str(num_envs), str(batches_path)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True,
                start_new_session=True)
        self._closed = False
        if self.proc.stdin is None or self.proc.stdout is None:  # both are PIPE
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError("the PufferLib Multiprocessing child has no pipes")
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        try:  # the child's whole group goes whatever stops the handshake (^C too)
            first = self._line(0.0).strip()
            if not first.startswith("ready "):
                why = first.removeprefix("error ") or self._stderr_tail()
                raise RuntimeError(why or "the child exited without a word")
            self.rows = int(first.split()[1])
        except BaseException:
            self.close()
            raise

    def _line(self, seconds: float) -> str:
        """The child's next line ("" if it ended or did not answer in time)."""
        ready, _, _ = select.select([self.stdout], [], [], seconds + ANSWER_TIMEOUT_S)
        return self.stdout.readline() if ready else ""

    def _stderr_tail(self) -> str:
        lines = [x for x in self.stderr_path.read_text(errors="replace").splitlines()
                 if x.strip()]
        return lines[-1] if lines else ""

    def rate(self, seconds: float) -> float:
        self.stdin.write(f"rate {seconds}\n")
        self.stdin.flush()
        answer = self._line(seconds)
        if not answer:
            self.close()
            raise RuntimeError("PufferLib Multiprocessing child died or hung: "
                               f"{self._stderr_tail()}")
        return float(answer)

    def close(self) -> None:
        """Ask the child to close its vec and exit; kill its whole group
        (its PufferLib workers too) if it does not.  Once: the group's id
        is not the child's after it is reaped."""
        if self._closed:
            return
        self._closed = True
        if self.proc.poll() is None:
            try:
                self.stdin.write("close\n")
                self.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # workers left behind, if any
        except ProcessLookupError:
            pass
        self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stdin):
            if stream is not None and not stream.closed:
                stream.close()


if __name__ == "__main__":
    _serve(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]),
           Path(sys.argv[5]))
