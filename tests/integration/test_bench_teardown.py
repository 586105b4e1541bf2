"""envd.tools.bench_teardown: a benchmark killed with SIGTERM ends, whatever
code it was running (a peer's catch-all that swallows exceptions, a close
that never returns), and leaves no daemon, process or folder behind."""
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from envd.tools import bench_teardown

#: A stand-in for a daemon: writes the file argv[1] when SIGTERM reaches it.
DAEMON = textwrap.dedent("""
    import os, signal, sys, time
    def stop(*_):
        open(sys.argv[1], "w").close()
        os._exit(0)
    signal.signal(signal.SIGTERM, stop)
    print(flush=True)
    while True:
        time.sleep(1)
""")

#: A stand-in for a benchmark run: registers a "daemon" (DAEMON) and a
#: folder, starts a grandchild that ignores SIGTERM (a peer's worker), says
#: "ready", then runs code that swallows every exception and never ends.
RUN = textwrap.dedent("""
    import os, subprocess, sys, time
    from envd.tools import bench_teardown

    out, daemon_code = sys.argv[1], sys.argv[2]
    bench_teardown.install()
    daemon = subprocess.Popen([sys.executable, "-c", daemon_code,
                               os.path.join(out, "daemon-stopped")], stdout=subprocess.PIPE)
    daemon.stdout.readline()  # its handler is in place
    worker = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
        "while True: time.sleep(1)"])
    with open(os.path.join(out, "pids"), "w") as f:
        f.write(f"{daemon.pid} {worker.pid}")
    with bench_teardown.daemon(daemon), bench_teardown.temporary_folder("envd-teardown-") as folder:
        with open(os.path.join(out, "folder"), "w") as f:
            f.write(folder)
        print("ready", flush=True)
        while True:
            try:
                time.sleep(1)
            except BaseException:  # a peer's catch-all
                pass
""")


def alive(pid: int) -> bool:
    """pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:].split()[0] != b"Z"


def exit_status_after_sigterm(proc: subprocess.Popen) -> int:
    """Send proc SIGTERM and return its exit status (killed, and the test
    failed, if it does not exit within a generous deadline)."""
    try:
        proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def gone(pid: int) -> bool:
    """Whether pid is gone within a generous deadline (SIGKILL is delivered,
    not awaited: poll)."""
    deadline = time.monotonic() + 60
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def test_sigterm_ends_a_run_that_swallows_exceptions_and_leaves_nothing(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", RUN, str(tmp_path), DAEMON],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        folder = (tmp_path / "folder").read_text()
        daemon_pid, worker_pid = map(int, (tmp_path / "pids").read_text().split())
        assert os.path.isdir(folder) and alive(daemon_pid) and alive(worker_pid)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    assert exit_status_after_sigterm(proc) == 128 + signal.SIGTERM
    assert (tmp_path / "daemon-stopped").exists(), "the daemon was not sent SIGTERM"
    assert not os.path.exists(folder)
    assert gone(worker_pid), "a descendant outlived the run"
    assert not alive(daemon_pid)


#: A run whose main thread waits on its registered daemon (Popen.wait, which
#: holds that Popen's lock) when SIGTERM comes; the daemon ignores SIGTERM, so
#: only the teardown's SIGKILL after the grace ends it.
WAITING_RUN = textwrap.dedent("""
    import subprocess, sys
    from envd.tools import bench_teardown

    bench_teardown.install()
    bench_teardown.DAEMON_GRACE_SECONDS = 0.5
    daemon = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
        "print(flush=True)\\n"
        "while True: time.sleep(1)"], stdout=subprocess.PIPE)
    daemon.stdout.readline()  # SIGTERM is ignored from here on
    print(daemon.pid, flush=True)
    with bench_teardown.daemon(daemon):
        daemon.wait()
""")


def test_sigterm_while_the_run_waits_on_its_daemon_ends_it(tmp_path):
    """The handler interrupts the main thread inside the daemon's
    Popen.wait: the teardown must not wait on that Popen (its lock is held)."""
    proc = subprocess.Popen([sys.executable, "-c", WAITING_RUN], stdout=subprocess.PIPE,
                            text=True)
    try:
        daemon_pid = int(proc.stdout.readline())
        deadline = time.monotonic() + 60
        while b"wait" not in _wchan(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)  # (polls for the event: the main thread asleep in its wait)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    assert exit_status_after_sigterm(proc) == 128 + signal.SIGTERM
    assert gone(daemon_pid)


def _wchan(pid: int) -> bytes:
    """Where pid sleeps in the kernel (b"" if unknown)."""
    try:
        with open(f"/proc/{pid}/wchan", "rb") as f:
            return f.read()
    except OSError:
        return b""


def test_a_forked_child_dies_as_sigterm_would_and_tears_nothing_down(tmp_path):
    """A peer's multiprocessing worker forked from the run inherits the
    handler; SIGTERM from the peer's own close must not stop the run's
    daemons or remove its folders."""
    script = textwrap.dedent("""
        import os, signal, sys, time
        from envd.tools import bench_teardown
        bench_teardown.install()
        with bench_teardown.temporary_folder("envd-teardown-") as folder:
            ready_r, ready_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                # (a signal that arrives while the child's interpreter is
                # still reinitialising after fork is lost: say when it runs)
                os.write(ready_w, b"x")
                while True:
                    time.sleep(1)
            os.read(ready_r, 1)
            os.kill(pid, signal.SIGTERM)
            _, status = os.waitpid(pid, 0)
            print(os.WIFSIGNALED(status) and os.WTERMSIG(status), os.path.isdir(folder))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.split() == [str(int(signal.SIGTERM)), "True"]


def test_descendants_lists_children_and_grandchildren():
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import subprocess, sys, time
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(grandchild.pid, flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    grandchild = None
    try:
        grandchild = int(child.stdout.readline())
        found = bench_teardown.descendants(os.getpid())
        assert child.pid in found and grandchild in found
        assert found.index(child.pid) < found.index(grandchild)
        assert os.getpid() not in found
    finally:
        child.kill()
        child.wait()
        if grandchild is not None:
            with contextlib.suppress(OSError):
                os.kill(grandchild, signal.SIGKILL)


@pytest.mark.parametrize("comm", ["a b", "x) (y", ")"])
def test_descendants_reads_a_stat_line_whose_name_holds_spaces_and_parentheses(tmp_path, comm):
    """/proc/PID/stat's second field is the command name in parentheses,
    which may itself hold spaces and ')': the parent is read after the
    last ')'."""
    child = subprocess.Popen([sys.executable, "-c",
                              "import ctypes, sys, time; libc = ctypes.CDLL(None);"
                              "libc.prctl(15, sys.argv[1].encode(), 0, 0, 0);"  # PR_SET_NAME
                              "print(flush=True); time.sleep(600)", comm],
                             stdout=subprocess.PIPE, text=True)
    try:
        child.stdout.readline()
        with open(f"/proc/{child.pid}/comm") as f:
            assert f.read().strip() == comm
        assert child.pid in bench_teardown.descendants(os.getpid())
    finally:
        child.kill()
        child.wait()
