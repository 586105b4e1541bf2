"""Adapters exposing envd's vector envs to other RL libraries.

Each lives in its own module and imports its library only when that module is
imported (``import envd`` never does): ``envd.integrations.sb3`` for
Stable-Baselines3 (``pip install 'envd-rl[sb3]'``), ``envd.integrations.ray``
for daemons placed one per Ray node (``'envd-rl[ray]'``) and
``envd.integrations.rllib`` for RLlib's env runners (``'envd-rl[rllib]'``).
"""
