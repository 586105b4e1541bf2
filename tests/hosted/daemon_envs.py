"""Ids of the test envs (envs.py) for a daemon's --import (and the in-process
tests): the daemon serves only registered ids its operator allowed, never a
creator."""
import gymnasium

gymnasium.register("envd-test/Raising-v0", entry_point="envs:FailingEnv",
                   kwargs={"fail_seed": 2, "at_step": 3, "how": "raise"})
gymnasium.register("envd-test/Hanging-v0", entry_point="envs:HangingEnv",
                   kwargs={"fail_seed": 0, "at_step": 2})
gymnasium.register("envd-test/Exiting-v0", entry_point="envs:FailingEnv",
                   kwargs={"fail_seed": 1, "at_step": 2, "how": "exit"})
gymnasium.register("envd-test/DictObs-v0", entry_point="envs:DictObsEnv",
                   max_episode_steps=20)
gymnasium.register("envd-test/MultiDiscrete-v0", entry_point="envs:MultiDiscreteActionEnv",
                   max_episode_steps=30)
gymnasium.register("envd-test/HangingReset-v0", entry_point="envs:HangingEnv",
                   kwargs={"fail_seed": 0, "at_step": 0})
gymnasium.register("envd-test/HangingMake-v0", entry_point="envs:HangingMakeEnv")
gymnasium.register("envd-test/SlowClose-v0", entry_point="envs:SlowCloseEnv")
gymnasium.register("envd-test/HangingConstructor-v0", entry_point="envs:HangingConstructorEnv")
gymnasium.register("envd-test/ExitingConstructor-v0", entry_point="envs:ExitingConstructorEnv")
gymnasium.register("envd-test/ColumnInfo-v0", entry_point="envs:ColumnInfoEnv",
                   max_episode_steps=20)
gymnasium.register("envd-test/HangingCall-v0", entry_point="envs:HangingCallEnv",
                   max_episode_steps=500)
