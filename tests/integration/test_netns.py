"""One trainer, many hosts -- emulated with network namespaces: two daemons,
each in its own network namespace (a veth pair to the root namespace) and
its own mount namespace with a private /dev/shm, so that for shared memory
and networking they are other hosts.  One trainer in the root namespace
drives both through one MultiVecEnv over tcp (the arrays travel inline: it
cannot map their segments) and gets the in-process results bit for bit; a
daemon killed mid-run is named in the trainer's error.

Needs root, `ip` and `unshare`; skipped (saying why) only where network
namespaces cannot be created.  Every namespace and veth is removed whatever
happens."""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from support.daemon import DEADLINE, in_bounds_actions, segments_of, wait_until

import envd

PORT = 5555  # each daemon has a namespace of its own: no clash with anything else


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=30, check=check)


def namespaces_unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"no `{tool}` command"
    probe = f"envdprobe{os.getpid()}"
    made = run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` fails here: {made.stderr.strip()}"
    run("ip", "netns", "del", probe, check=False)
    return None


def free_subnets(count: int) -> list[int]:
    """Third octets of 10.77.X.0/24 subnets no interface uses (starting at a
    pid-derived one, so concurrent runs rarely even try the same)."""
    used = run("ip", "-4", "addr").stdout
    start = 1 + os.getpid() % 200
    octets = [x for x in [*range(start, 255), *range(1, start)] if f"10.77.{x}." not in used]
    assert len(octets) >= count, "no free 10.77.X.0/24 subnet"
    return octets[:count]


class Host:
    """A network namespace joined to the root namespace by a veth pair:
    10.77.X.1 on the root side, 10.77.X.2 inside."""

    def __init__(self, name: str, octet: int):
        self.netns = name
        self.outside, self.inside = f"{name}r", f"{name}n"  # <= 15 characters
        self.octet = octet
        self.address = f"10.77.{octet}.2"
        self.daemon: subprocess.Popen | None = None
        self.log_path = None

    def create(self) -> None:
        """The namespace, the veth pair and the addresses (remove() undoes
        whatever part of it was done)."""
        octet = self.octet
        run("ip", "netns", "add", self.netns)
        run("ip", "link", "add", self.outside, "type", "veth", "peer", "name", self.inside)
        run("ip", "link", "set", self.inside, "netns", self.netns)
        run("ip", "addr", "add", f"10.77.{octet}.1/24", "dev", self.outside)
        run("ip", "link", "set", self.outside, "up")
        run("ip", "netns", "exec", self.netns, "ip", "addr", "add", f"{self.address}/24",
            "dev", self.inside)
        run("ip", "netns", "exec", self.netns, "ip", "link", "set", self.inside, "up")
        run("ip", "netns", "exec", self.netns, "ip", "link", "set", "lo", "up")

    @property
    def endpoint(self) -> str:
        return f"tcp://{self.address}:{PORT}"

    def start_daemon(self, folder) -> None:
        """`envd --threads 1` on this host's address, with a /dev/shm of its
        own (a tmpfs in a private mount namespace).  ip netns exec, unshare
        and sh all exec, so the Popen's pid is the daemon's."""
        folder.mkdir(parents=True, exist_ok=True)
        self.log_path = folder / "envd.log"
        daemon = shlex.join([sys.executable, "-m", "envd", "--threads", "1",
                             "--lease-timeout", "10", "--bind", self.endpoint, "--insecure"])
        with open(self.log_path, "ab") as log:
            self.daemon = subprocess.Popen(
                ["ip", "netns", "exec", self.netns, "unshare", "--mount", "--propagation",
                 "private", "sh", "-c",
                 f"mount -t tmpfs -o size=256m tmpfs /dev/shm && exec {daemon}"],
                cwd=folder, stdout=log, stderr=subprocess.STDOUT)

    def wait_answers(self) -> None:
        def answers() -> bool:
            if self.daemon.poll() is not None:
                raise AssertionError(f"the daemon in {self.netns} exited with "
                                     f"{self.daemon.returncode}:\n{self.log()}")
            try:
                with envd.connect(self.endpoint, timeout=2):
                    return True
            except (envd.ConnectionLostError, envd.EnvdTimeoutError):
                return False
        wait_until(answers, what=f"the daemon at {self.endpoint} to answer")

    def log(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    def remove(self) -> None:
        """Stop the daemon, then remove the veth pair and the namespace (never raises)."""
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.kill()
        if self.daemon is not None:
            try:
                self.daemon.wait(DEADLINE)
            except subprocess.TimeoutExpired:
                pass
        run("ip", "link", "del", self.outside, check=False)  # takes its peer along
        run("ip", "netns", "del", self.netns, check=False)


@pytest.fixture
def hosts(tmp_path):
    reason = namespaces_unavailable()
    if reason:
        pytest.skip(reason)
    made: list[Host] = []
    try:
        for k, octet in enumerate(free_subnets(2)):
            made.append(Host(f"ev{os.getpid()}{k}", octet))
            made[-1].create()
            made[-1].start_daemon(tmp_path / f"host{k}")
        for host in made:
            host.wait_answers()
        yield made
    finally:
        for host in made:
            host.remove()
    namespaces, links = run("ip", "netns", "list").stdout, run("ip", "link").stdout
    for host in made:
        assert host.netns not in namespaces and host.outside not in links, "left behind"


def test_one_trainer_two_hosts(hosts):
    first, second = hosts
    started = time.monotonic()
    multi = envd.connect([first.endpoint, second.endpoint], timeout=10)
    try:
        statuses = multi.status()
        pids = [status["pid"] for status in statuses]
        assert pids == [first.daemon.pid, second.daemon.pid]
        with envd.make("Acrobot-v1", 6, seed=21, max_episode_steps=40,
                       num_threads=0) as local:
            env = multi.make("Acrobot-v1", 6, seed=21, max_episode_steps=40)
            # other hosts for shared memory: their segments are not in our /dev/shm,
            # so the arrays travel inline
            assert all(segments_of(pid) == [] for pid in pids)
            assert [getattr(shard, "transport", None) for shard in env.shards] == ["inline"] * 2
            obs, _ = env.reset()
            assert obs.tobytes() == local.reset()[0].tobytes()
            rng = np.random.default_rng(5)
            episodes = 0
            for step in range(80):
                actions = in_bounds_actions(local.single_action_space, 6, rng)
                got, want = env.step(actions), local.step(actions)
                for name, a, b in zip(("obs", "rewards", "terminations", "truncations"),
                                      got[:4], want[:4]):
                    assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), f"{name} step {step}"
                assert got[4].keys() == want[4].keys(), step
                if "envd_episode" in want[4]:
                    for key in "rl":
                        assert got[4]["envd_episode"][key].tobytes() == \
                            want[4]["envd_episode"][key].tobytes(), step
                episodes += int((want[2] | want[3]).sum())
            assert episodes >= 6
            # the second host's daemon dies: the next step names it
            second.daemon.send_signal(signal.SIGKILL)
            second.daemon.wait(DEADLINE)
            with pytest.raises((envd.ConnectionLostError, envd.EnvdTimeoutError)) as info:
                env.step(in_bounds_actions(local.single_action_space, 6, rng))
            assert second.endpoint in str(info.value) and first.endpoint not in str(info.value)
            env.close()
        with envd.connect(first.endpoint, timeout=10) as probe:
            wait_until(lambda: probe.status()["sessions"] == 0,
                       what="the surviving daemon's shard closed")
    finally:
        multi.close()
    assert time.monotonic() - started < 4 * DEADLINE
