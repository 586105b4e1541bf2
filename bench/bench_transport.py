"""Remote sessions: the inline transport over TCP versus shared memory.

For CartPole-v1 (4 float32 per env) and Snake-v0 (84x84 uint8 per env), N in
{64, 1024, 4096}, all in one run, env steps per second of sync steps through:

  - shm:            the daemon's ipc socket, arrays in shared memory (same host)
  - inline ipc:     the same socket, arrays sent as frames (the cost of the
                    copies and frames alone, without a network)
  - inline tcp lo:  tcp://127.0.0.1, arrays as frames
  - inline tcp veth: tcp to a daemon in its own network namespace over a veth
                    pair (as another host would be reached; needs root and
                    `ip netns`, else the row is left out with the reason)

For each it prints the payload bytes per step call (the actions sent plus the
output arrays received), the payload rate it reached, and that rate against
the link's own bandwidth, measured in the same run with plain ZeroMQ messages
of 4 MiB on the same path (what the transport could at most move).

Each configuration is measured in several rounds in a fresh random order; the
best round is kept (these machines are noisy).

    sudo python bench/bench_transport.py [--seconds 0.4] [--rounds 3] [--threads 2]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import zmq

import envd
from envd import protocol

ENVS = ["CartPole-v1", "Snake-v0"]
SIZES = [64, 1024, 4096]
NETNS_ADDRESS = "10.78.0.2"
ROOT_ADDRESS = "10.78.0.1"
CHUNK = 4 << 20  # bytes per message of the bandwidth probe

# A ZeroMQ sink for the bandwidth probe: answers every message with b"k".
SINK = """
import sys, zmq
s = zmq.Context().socket(zmq.ROUTER)
s.bind(sys.argv[1])
print("ready", flush=True)
while True:
    frames = s.recv_multipart(copy=False)
    if frames[1].bytes == b"stop":
        break
    s.send_multipart([frames[0], b"k"])
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_answers(endpoint: str, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with status {proc.returncode}")
        try:
            with envd.connect(endpoint, timeout=2):
                return
        except (envd.ConnectionLostError, envd.EnvdTimeoutError):
            time.sleep(0.1)
    raise SystemExit(f"{what} did not answer at {endpoint}")


class Netns:
    """A network namespace joined to this one by a veth pair (10.78.0.1 here,
    10.78.0.2 there), removed on exit."""

    def __init__(self):
        tag = os.getpid() % 100000
        self.name, self.here, self.there = f"envd-bench-{tag}", f"veb{tag}a", f"veb{tag}b"

    def __enter__(self) -> Netns:
        commands = [
            ["ip", "netns", "add", self.name],
            ["ip", "link", "add", self.here, "type", "veth", "peer", "name", self.there],
            ["ip", "link", "set", self.there, "netns", self.name],
            ["ip", "addr", "add", f"{ROOT_ADDRESS}/24", "dev", self.here],
            ["ip", "link", "set", self.here, "up"],
            ["ip", "netns", "exec", self.name, "ip", "addr", "add", f"{NETNS_ADDRESS}/24",
             "dev", self.there],
            ["ip", "netns", "exec", self.name, "ip", "link", "set", self.there, "up"],
            ["ip", "netns", "exec", self.name, "ip", "link", "set", "lo", "up"],
        ]
        try:
            for command in commands:
                subprocess.run(command, check=True, capture_output=True, text=True)
        except (subprocess.CalledProcessError, FileNotFoundError) as exc:
            self.__exit__()
            detail = exc.stderr.strip() if isinstance(exc, subprocess.CalledProcessError) else exc
            raise OSError(f"cannot make a network namespace: {detail}") from None
        return self

    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def __exit__(self, *exc) -> None:
        subprocess.run(["ip", "link", "del", self.here], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)


def start(command: list[str], log) -> subprocess.Popen:
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def link_bandwidth(endpoint: str, prefix: list[str], seconds: float) -> float:
    """Bytes per second plain ZeroMQ moves one way to a sink at endpoint
    (4 MiB messages, 4 in flight), started under prefix (a namespace)."""
    sink = subprocess.Popen([*prefix, sys.executable, "-c", SINK, endpoint],
                            stdout=subprocess.PIPE, text=True)
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        if sink.stdout.readline().strip() != "ready":
            raise SystemExit("the bandwidth sink did not start")
        sock.connect(endpoint)
        chunk = np.random.default_rng(0).integers(0, 256, CHUNK, np.uint8)
        for _ in range(2):  # warm up the connection
            sock.send(chunk, copy=False)
            sock.recv()
        sent, start = 0, time.perf_counter()
        for _ in range(4):
            sock.send(chunk, copy=False)
        while time.perf_counter() - start < seconds:
            sock.recv()
            sent += 1
            sock.send(chunk, copy=False)
        for _ in range(4):
            sock.recv()
        sent += 4
        rate = sent * CHUNK / (time.perf_counter() - start)
        sock.send(b"stop")
        return rate
    finally:
        sock.close()
        context.term()
        try:
            sink.wait(10)
        except subprocess.TimeoutExpired:
            sink.kill()
            sink.wait()


def payload_bytes(env) -> int:
    """Bytes one sync step moves: the actions, and the output arrays back."""
    buffers = env._buffers
    return buffers["actions"].nbytes + sum(buffers[name].nbytes
                                           for name in protocol.output_arrays(buffers))


def steps_per_second(env, actions: np.ndarray, seconds: float) -> float:
    env.step(actions)
    calls, start = 0, time.perf_counter()
    while True:
        for _ in range(4):
            env.step(actions)
        calls += 4
        now = time.perf_counter()
        if now - start >= seconds:
            return calls * len(actions) / (now - start)


def measure(paths: dict[str, tuple[envd.Client, str]], seconds: float,
            rounds: int) -> dict[tuple[str, int, str], tuple[float, int]]:
    """(env, N, path) -> (best env steps per second, payload bytes per call)."""
    envs = {}
    for env_id in ENVS:
        for n in SIZES:
            for name, (client, transport) in paths.items():
                env = client.make(env_id, n, seed=0, transport=transport)
                assert env.transport == transport, (name, env.transport)
                env.reset()
                actions = np.stack([env.single_action_space.sample() for _ in range(n)])
                envs[(env_id, n, name)] = (env, actions)
    best: dict[tuple[str, int, str], float] = {}
    keys = list(envs)
    for round_index in range(rounds):
        random.shuffle(keys)
        for key in keys:
            env, actions = envs[key]
            best[key] = max(best.get(key, 0.0), steps_per_second(env, actions, seconds))
        print(f"  round {round_index + 1}/{rounds} done", file=sys.stderr, flush=True)
    table = {key: (best[key], payload_bytes(envs[key][0])) for key in envs}
    for env, _ in envs.values():
        env.close()
    return table


def report(table, bandwidth: dict[str, float]) -> None:
    names = list(dict.fromkeys(path for _, _, path in table))
    print("\nlink bandwidth (plain ZeroMQ, 4 MiB messages, one way):")
    for name, rate in bandwidth.items():
        print(f"  {name:<18} {rate / 1e6:9.0f} MB/s")
    for env_id in ENVS:
        print(f"\n{env_id}: env steps per second (payload MB/s, share of the link)")
        print(f"{'N':>6} {'bytes/call':>11}  " + "  ".join(f"{n:>28}" for n in names))
        for n in SIZES:
            cells = []
            shm_rate = table[(env_id, n, "shm")][0]
            for name in names:
                rate, size = table[(env_id, n, name)]
                megabytes = rate / n * size / 1e6
                share = (f" {megabytes * 1e6 / bandwidth[name]:4.0%}" if name in bandwidth
                         else "      ")
                ratio = "" if name == "shm" else f" {rate / shm_rate:4.2f}x"
                cells.append(f"{rate / 1e6:7.2f}M {megabytes:7.0f}MB/s{share}{ratio:>7}")
            size = table[(env_id, n, "shm")][1]
            print(f"{n:>6} {size:>11}  " + "  ".join(f"{c:>28}" for c in cells))
    print("\nratios are against shm at the same N; the share is the payload rate over "
          "the link's bandwidth")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=0.4, help="per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="daemon threads (default: CPUs)")
    args = parser.parse_args()
    threads = ["--threads", str(args.threads)] if args.threads is not None else []
    folder = tempfile.mkdtemp(prefix="envd-bench-transport-")
    ipc, port = f"ipc://{folder}/envd.sock", free_port()
    tcp = f"tcp://127.0.0.1:{port}"
    procs, clients = [], []
    bandwidth: dict[str, float] = {}
    with contextlib.ExitStack() as stack, open(os.path.join(folder, "daemons.log"), "ab") as log:
        stack.callback(shutil.rmtree, folder, True)
        stack.callback(lambda: [stop(p) for p in procs])
        stack.callback(lambda: [c.close() for c in clients])
        daemon = [sys.executable, "-m", "envd", "--log-level", "warning", *threads]
        procs.append(start([*daemon, "--bind", ipc, "--bind", tcp], log))
        wait_answers(ipc, procs[0], "the local daemon")
        paths = {}
        for name, endpoint, transport in (("shm", ipc, "shm"), ("inline ipc", ipc, "inline"),
                                          ("inline tcp lo", tcp, "inline")):
            clients.append(envd.connect(endpoint))
            paths[name] = (clients[-1], transport)
        bandwidth["inline tcp lo"] = link_bandwidth(f"tcp://127.0.0.1:{free_port()}", [], 1.0)
        try:
            netns = stack.enter_context(Netns())
        except OSError as exc:
            print(f"(no veth row: {exc}; run as root with iproute2)", file=sys.stderr)
        else:
            remote = f"tcp://{NETNS_ADDRESS}:5555"
            procs.append(start([*netns.prefix(), *daemon, "--bind", remote, "--insecure"], log))
            wait_answers(remote, procs[-1], "the daemon in the network namespace")
            clients.append(envd.connect(remote))
            paths["inline tcp veth"] = (clients[-1], "inline")
            bandwidth["inline tcp veth"] = link_bandwidth(f"tcp://{NETNS_ADDRESS}:5556",
                                                          netns.prefix(), 1.0)
        print(f"measuring {len(ENVS)} envs x N in {SIZES} x {len(paths)} paths, "
              f"{args.rounds} rounds of {args.seconds:g} s", file=sys.stderr)
        table = measure(paths, args.seconds, args.rounds)
    report(table, bandwidth)


if __name__ == "__main__":
    main()
