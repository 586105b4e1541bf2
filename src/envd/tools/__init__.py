"""envd.tools: the programs built on every layer, above the ground floor.

    envd.tools.cli     the ``envd`` command (daemon, list, status, keygen, bench)
    envd.tools.bench   ``envd bench``: the performance comparison on this machine

Nothing in the ground floor (envd/*.py), envd.client, envd.server or
envd.native imports from here (tests/client/test_layering.py checks it); the
CLI imports the bench only when ``envd bench`` runs, and the bench never
imports the CLI.
"""
