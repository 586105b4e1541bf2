"""A hyper-parameter sweep: K PPO trainer processes sharing one envd daemon.

    python examples/sweep.py                         # starts its own daemon, 4 trainers
    python examples/sweep.py --endpoint ipc:///tmp/envd-ppo/envd.sock --num-trainers 6

Each trainer is a separate process with its own connection (client) to the
daemon, its own seed and learning rate (trainer k: seed ``--seed + k``,
learning rate ``--learning-rates[k % len]``), and runs the PPO of
ppo_cartpole.py (imported, not copied) for a short budget on its own
CartPole-v1 envs, all stepped by the daemon's one thread pool: no worker
processes per trainer.  Once every trainer has made its envs they wait for each
other, and the sweep prints ``envd status`` at that peak (K sessions from K
trainer clients, plus the sweep's own monitoring client); then they train, and
the sweep prints a table of seed, learning rate, final mean return (last 20
episodes) and steps/s per trainer.

Without ``--endpoint`` the sweep starts ``envd --threads N`` on a private ipc
path in a temporary folder and stops it with SIGTERM at the end (its exit
status must be 0).  The exit status is 0 when every trainer finished with
finite losses (solving is not required: the budget is short).

Measured on the 2-core development box (shared with other work), defaults
(4 trainers x 8 envs, 30,000 steps each, own daemon with 1 thread):

    python examples/sweep.py
    -> peak: clients 5  sessions 4  envs 32 (4 trainers + the status command)
       mean returns 396.3, 202.6, 284.1, 388.9 after 29,696 steps each
       (lr 1e-3, 3e-4, 1e-3, 3e-4), 323-372 steps/s per trainer, 120 s wall
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import envd

#: Seconds to wait for a daemon to answer, for every trainer to make its envs,
#: and for a trainer's result after its budget (a loaded machine is slow).
DEADLINE = 120.0


def trainer(k: int, endpoint: str, seed: int, lr: float, num_envs: int, total_steps: int,
            barrier: Any, results: Any) -> None:
    """One trainer process: connect, make, wait for the others, train, report."""
    # Imported here: the sweep itself needs neither torch nor the PPO code.
    import torch
    from ppo_cartpole import Config, train
    torch.set_num_threads(1)
    report: dict[str, Any] = {"k": k, "seed": seed, "lr": lr}
    try:
        with envd.connect(endpoint) as client:
            report["client"] = client.client_id.hex()[:8]  # as the daemon logs it
            env = client.make("CartPole-v1", num_envs=num_envs, seed=seed,
                              autoreset_mode="same_step")
            barrier.wait(DEADLINE)  # every trainer holds its envs: the peak
            result = train(env, Config(num_envs=num_envs, total_steps=total_steps, seed=seed,
                                       learning_rate=lr, log_every=0))
            env.close()
        report.update(steps=result.steps, episodes=result.episodes,
                      mean_return=result.mean_return, solved=result.solved,
                      steps_per_s=result.steps_per_s, losses_finite=result.losses_finite)
    except BaseException as exc:  # noqa: BLE001 -- reported in the table
        report["error"] = f"{type(exc).__name__}: {exc}"
        barrier.abort()
    results.put(report)


def envd_command() -> list[str]:
    """The envd console script next to this Python, else `python -m envd`."""
    script = shutil.which("envd", path=os.path.dirname(sys.executable))
    return [script] if script else [sys.executable, "-m", "envd"]


def wait_for_daemon(endpoint: str, proc: subprocess.Popen | None) -> None:
    end = time.monotonic() + DEADLINE
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the daemon exited with {proc.returncode}")
        try:
            envd.connect(endpoint, timeout=2).close()
            return
        except envd.EnvdError:
            if time.monotonic() > end:
                raise RuntimeError(f"no daemon answered at {endpoint}") from None
            time.sleep(0.1)


def envd_status(endpoint: str, cwd: str) -> str:
    """What `envd status` prints for this daemon."""
    out = subprocess.run([*envd_command(), "status", "--endpoint", endpoint], cwd=cwd,
                         capture_output=True, text=True, timeout=DEADLINE)
    return out.stdout + out.stderr


def table(reports: list[dict[str, Any]]) -> str:
    lines = [f"{'trainer':>7}  {'client':8}  {'seed':>4}  {'lr':>8}  {'steps':>7}  "
             f"{'episodes':>8}  {'mean return':>11}  {'solved':>6}  {'steps/s':>7}"]
    for r in sorted(reports, key=lambda r: r["k"]):
        if "error" in r:
            lines.append(f"{r['k']:>7}  {r.get('client', '-'):8}  {r['seed']:>4}  "
                         f"{r['lr']:>8.1e}  failed: {r['error']}")
            continue
        lines.append(f"{r['k']:>7}  {r['client']:8}  {r['seed']:>4}  {r['lr']:>8.1e}  "
                     f"{r['steps']:>7}  {r['episodes']:>8}  {r['mean_return']:>11.1f}  "
                     f"{r['solved']!s:>6}  {r['steps_per_s']:>7.0f}")
    return "\n".join(lines)


def collect(procs: list, configs: list[tuple[float, float]], results: Any) -> list[dict[str, Any]]:
    """One report per trainer; a trainer that died without one is reported too."""
    reports: dict[int, dict[str, Any]] = {}
    while len(reports) < len(procs):
        try:
            report = results.get(timeout=0.5)
            reports[report["k"]] = report
        except queue.Empty:
            for k, p in enumerate(procs):
                if k not in reports and not p.is_alive() and results.empty():
                    time.sleep(0.5)  # a report put just before exiting may be in transit
                    if results.empty():
                        reports[k] = {"k": k, "seed": configs[k][0], "lr": configs[k][1],
                                      "error": f"exited with {p.exitcode} without a report"}
    return list(reports.values())


def run_sweep(args: argparse.Namespace, endpoint: str, workdir: str) -> list[dict[str, Any]]:
    ctx = mp.get_context("spawn")  # no forked copies of zmq sockets or torch threads
    k_total = args.num_trainers
    barrier, results = ctx.Barrier(k_total + 1), ctx.Queue()
    lrs = [float(x) for x in args.learning_rates.split(",")]
    configs = [(args.seed + k, lrs[k % len(lrs)]) for k in range(k_total)]
    procs = [ctx.Process(target=trainer, name=f"trainer-{k}",
                         args=(k, endpoint, seed, lr, args.num_envs, args.total_steps,
                               barrier, results))
             for k, (seed, lr) in enumerate(configs)]
    for p in procs:
        p.start()
    try:
        try:
            barrier.wait(DEADLINE)  # released: the trainers train now
            print(f"\nenvd status with all {k_total} trainers connected:\n"
                  f"{envd_status(endpoint, workdir)}", flush=True)
        except Exception:  # noqa: BLE001 -- a trainer failed; its report says why
            print("a trainer failed before training: no peak status", flush=True)
        reports = collect(procs, configs, results)
    finally:
        for p in procs:
            p.join(DEADLINE)
            if p.is_alive():
                p.kill()
                p.join()
    return reports


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--endpoint", default=None,
                   help="a running daemon's endpoint (default: start one on a private ipc path)")
    p.add_argument("--num-trainers", type=int, default=4, help="trainer processes (K)")
    p.add_argument("--learning-rates", default="1e-3,3e-4",
                   help="comma-separated; trainer k takes the (k mod n)-th")
    p.add_argument("--seed", type=int, default=1, help="trainer k uses seed + k")
    p.add_argument("--num-envs", type=int, default=8, help="envs per trainer")
    p.add_argument("--total-steps", type=int, default=30_000, help="budget per trainer")
    p.add_argument("--daemon-threads", type=int, default=1,
                   help="--threads of the daemon the sweep starts")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Trainers import ppo_cartpole from this folder (spawned children inherit sys.path).
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="envd-sweep-") as workdir:
        daemon = None
        endpoint = args.endpoint
        if endpoint is None:
            endpoint = f"ipc://{workdir}/envd.sock"
            log = open(Path(workdir) / "envd.log", "ab")  # noqa: SIM115 -- the daemon's, while it runs
            # cwd: the sweep's work folder, beside its socket and log.
            daemon = subprocess.Popen([*envd_command(), "--threads", str(args.daemon_threads),
                                       "--bind", endpoint], cwd=workdir, stdout=log,
                                      stderr=subprocess.STDOUT)
            print(f"started envd (pid {daemon.pid}) at {endpoint}", flush=True)
        try:
            wait_for_daemon(endpoint, daemon)
            reports = run_sweep(args, endpoint, workdir)
        finally:
            if daemon is not None:
                daemon.send_signal(signal.SIGTERM)
                try:
                    code = daemon.wait(DEADLINE)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    code = daemon.wait()
                log.close()
                print(f"stopped envd (SIGTERM): exit status {code}", flush=True)
    wall = time.perf_counter() - start
    print(f"\n{table(reports)}")
    ok = all("error" not in r and r["losses_finite"] for r in reports)
    clients = {r.get("client") for r in reports}
    print(f"RESULT trainers={len(reports)} distinct_clients={len(clients)} ok={ok} "
          f"wall_s={wall:.1f}", flush=True)
    if daemon is not None and code != 0:
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
