"""segment_guard.c: a client truncating its segment revokes the daemon's
mapping instead of raising SIGBUS; other SIGBUS faults still kill.

segment_guard_check.c does the checking (its header lists what); it runs
plain and under ThreadSanitizer and AddressSanitizer, since the handler
races map, unmap and other threads' faults by design.
"""
from pathlib import Path

import cbuild
import pytest

CHECK = Path(__file__).resolve().parent / "segment_guard_check.c"
SOURCES = ["segment_guard.c", CHECK]
DIVISORS = {"plain": 1, "tsan": 4, "asan": 2}


@pytest.mark.parametrize("kind", list(DIVISORS))
def test_segment_guard(kind):
    cbuild.run_stress(SOURCES, "segment_guard", kind, DIVISORS[kind], timeout=300)
