"""backend_workers.c on its own (tests/native/workers_check.c), plain and
under AddressSanitizer + UBSan: client bytes read as bytes, Discrete bounds
without overflow, a repeated id refused, a silent worker killed after the
call's timeout, the envs' books kept by env_slot.h's rules over the raw
outputs of an inline worker (issue 39)."""
from __future__ import annotations

from pathlib import Path

import pytest
from cbuild import run_stress

CHECK = Path(__file__).with_name("workers_check.c")


@pytest.mark.parametrize("kind", ["plain", "asan"])
def test_workers_backend_checks(kind):
    run_stress([CHECK, "backend_workers.c", "env_slot.c", "errors.c"], "workers_check", kind, 1, timeout=120)
