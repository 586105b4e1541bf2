"""envd.server: the daemon (``envd --threads N``): config, event loop, sessions, leases."""
from envd.server.config import Config
from envd.server.daemon import Daemon, run_daemon

__all__ = ["Config", "Daemon", "run_daemon"]
