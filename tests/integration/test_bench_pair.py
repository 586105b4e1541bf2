"""The capped-pair comparison of ``envd bench`` (src/envd/tools/bench_pair.py),
without timing: the rounds interleave the configurations, rates and totals
come from what the client processes report, the target and the report read
the rounds, and a client process steps its session in the windows it is given."""
from __future__ import annotations

import multiprocessing
import threading
import time

import pytest
from support.daemon import DaemonProcess, wait_until

from envd.tools import bench_pair


class FakeWorkers:
    """Workers whose sessions report made-up steps: config -> (cheap, heavy)
    env steps per window, window ends 2 s after its start."""

    def __init__(self, steps: dict[str, tuple[int, int]]):
        self.steps, self.calls = steps, []
        self.fast_path = {c: {"cheap": True, "heavy": True} for c in bench_pair.CONFIGS}

    def step_window(self, config, seconds):
        self.calls.append(config)
        start = 100.0 + len(self.calls)
        cheap, heavy = self.steps[config]
        return start, {"cheap": (cheap, start + 2.0), "heavy": (heavy, start + 2.0)}


def test_the_pair_measures_every_configuration_once_per_round():
    workers = FakeWorkers({"capped": (4000, 200), "uncapped": (3000, 100)})
    seen = []
    entry = bench_pair.measure(workers, rounds=3, seconds=0.5, on_measure=seen.append)
    assert [sorted(workers.calls[i:i + 2]) for i in range(0, 6, 2)] == \
        [["capped", "uncapped"]] * 3
    assert len(seen) == 6 and all("round" in label for label in seen)
    assert entry["rounds"]["capped"] == {"cheap": [2000.0] * 3, "heavy": [100.0] * 3}
    assert entry["rounds"]["uncapped"] == {"cheap": [1500.0] * 3, "heavy": [50.0] * 3}
    assert entry["totals"] == {"capped": [2100.0] * 3, "uncapped": [1550.0] * 3}
    assert entry["cheap"] == {"env_id": "CartPole-v1", "num_envs": 4096}
    assert bench_pair.ratios(entry) == [2100.0 / 1550.0] * 3
    assert bench_pair.ratios(entry, "heavy") == [2.0] * 3


def entry_with(capped: list[float], uncapped: list[float]) -> dict:
    """A measured entry whose cheap session makes the whole total."""
    return {"cheap": {"env_id": "CartPole-v1", "num_envs": 4096},
            "heavy": {"env_id": "ConnectFour-v0", "num_envs": 256},
            "rounds": {"capped": {"cheap": capped, "heavy": [0.0] * len(capped)},
                       "uncapped": {"cheap": uncapped, "heavy": [0.0] * len(uncapped)}},
            "totals": {"capped": capped, "uncapped": uncapped},
            "fast_path": {"capped": {"cheap": True, "heavy": True},
                          "uncapped": {"cheap": True, "heavy": False}}}


@pytest.mark.parametrize("capped,uncapped,status", [
    ([12.0, 12.0, 12.0], [10.0, 10.0, 10.0], "PASS"),
    ([9.0, 9.0, 9.0], [10.0, 10.0, 10.0], "FAIL"),
    ([8.0, 10.5, 13.0], [10.0, 10.0, 10.0], "NOT JUDGED"),  # the rounds straddle 1.0x
])
def test_the_target_is_judged_from_the_per_round_ratios(capped, uncapped, status):
    (target,) = bench_pair.targets(entry_with(capped, uncapped))
    assert target["status"] == status, target
    assert "pair total >= 1.0x uncapped" in target["target"] and " = " in target["detail"]


def test_the_report_and_summary_show_each_session_and_the_ratios():
    entry = entry_with([12.0, 12.0], [10.0, 10.0])
    lines = bench_pair.report_lines(entry)
    assert "CartPole-v1 x4096" in lines[0] and "ConnectFour-v0 x256" in lines[0]
    assert lines[1].lstrip().startswith("capped (max_threads=0)") and "(fast path)" in lines[1]
    assert lines[2].lstrip().startswith("uncapped (max_threads=None)")
    assert "(socket path)" in lines[2]  # not every session took the fast path
    assert lines[3].lstrip().startswith("capped / uncapped") and "1.20x" in lines[3]
    assert bench_pair.summary(entry)["summary"]["capped_over_uncapped"]["pair total"][
        "median"] == pytest.approx(1.2)
    assert bench_pair.targets({}) == [] and bench_pair.report_lines({}) == []
    assert bench_pair.summary({}) == {}


def test_a_session_client_steps_in_the_windows_it_is_given(tmp_path):
    """The client process's loop, run on a thread against a real daemon: it
    makes its session with the cap, reports ready, steps whole batches in a
    window, and closes its session when told to stop."""
    with DaemonProcess(tmp_path, "--threads", "2") as daemon, daemon.connect() as probe:
        parent, child = multiprocessing.Pipe()
        worker = threading.Thread(target=bench_pair.session_client,
                                  args=(daemon.endpoint, "CartPole-v1", 8, 0, child))
        worker.start()
        try:
            assert parent.poll(60)
            kind, fast_path = parent.recv()
            assert kind == "ready" and isinstance(fast_path, bool)
            (row,) = probe.status()["session_table"]
            assert row["max_threads"] == 0 and row["num_envs"] == 8
            start = time.monotonic() + 0.05
            parent.send((start, start + 0.05))
            assert parent.poll(60)
            steps, end = parent.recv()
            assert steps > 0 and steps % 8 == 0 and end >= start + 0.05
        finally:
            parent.send(None)
            worker.join(60)
        assert not worker.is_alive()
        wait_until(lambda: probe.status()["sessions"] == 0, what="the session closed")


def test_a_client_that_cannot_make_its_session_says_why(tmp_path):
    with DaemonProcess(tmp_path, "--threads", "1") as daemon:
        parent, child = multiprocessing.Pipe()
        bench_pair.session_client(daemon.endpoint, "CartPole-v1", 8, 5, child)  # over --threads
        kind, why = parent.recv()
        assert kind == "error" and "max_threads=5 is out of range" in why
