"""native/src/env_slot.{h,c}, the per-env rules, on their own: driven by
tests/native/env_slot_check.c with made-up raw outputs (no env, no vec),
checked against gymnasium's documented semantics (time limit, episode
statistics, the autoreset modes, refusals), the dead rows of multi-agent
envs and the books of envs that reset themselves, plain and under
AddressSanitizer + UBSan."""
from pathlib import Path

import pytest
from cbuild import run_stress


@pytest.mark.parametrize("kind", ["plain", "asan"])
def test_the_rules_hold_for_made_up_outputs(kind):
    run_stress([Path(__file__).with_name("env_slot_check.c"), "env_slot.c", "errors.c"],
               "env_slot_check", kind, 1, timeout=120)
