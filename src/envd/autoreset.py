"""Autoreset modes: make's autoreset_mode by name or gymnasium's AutoresetMode,
and the mark of an env that resets itself (ABI 5), the same for every entry
point (in-process, the client, the daemon, several daemons)."""
from __future__ import annotations

from typing import Any

from gymnasium.vector import AutoresetMode

from envd.errors import InvalidArgumentError

AUTORESET_MODE_NAMES = {"next_step": AutoresetMode.NEXT_STEP,
                        "same_step": AutoresetMode.SAME_STEP,
                        "disabled": AutoresetMode.DISABLED}


def parse_autoreset_mode(mode: str | AutoresetMode) -> AutoresetMode:
    """"next_step" | "same_step" | "disabled", or a gymnasium AutoresetMode
    (or its value, e.g. "NextStep")."""
    if isinstance(mode, AutoresetMode):
        return mode
    if isinstance(mode, str) and mode in AUTORESET_MODE_NAMES:
        return AUTORESET_MODE_NAMES[mode]
    if isinstance(mode, str) and mode in {m.value for m in AutoresetMode}:
        return AutoresetMode(mode)
    names = ", ".join(map(repr, AUTORESET_MODE_NAMES))
    raise InvalidArgumentError(f"unknown autoreset_mode {mode!r}; valid modes: {names}")


#: metadata["envd_autoreset"] of an env that resets itself (ABI 5
#: ENVD_ENV_RESETS_ITSELF); its metadata["autoreset_mode"] is SAME_STEP, the
#: gymnasium mode it is like (the observation after an episode's last step
#: is the next episode's first), without final_obs.
RESETS_ITSELF = "the env resets itself"


def mark_resets_itself(env: Any) -> None:
    """The metadata of a VecEnv of an env that resets itself."""
    env.metadata["autoreset_mode"] = AutoresetMode.SAME_STEP
    env.metadata["envd_autoreset"] = RESETS_ITSELF


def autoreset_mode_name(mode: AutoresetMode) -> str:
    return next(name for name, value in AUTORESET_MODE_NAMES.items() if value is mode)
