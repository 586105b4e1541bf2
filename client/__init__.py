"""envd.client: the trainer side -- connect to a daemon and drive its envs.

Needs only numpy, pyzmq, msgpack and gymnasium; never imports native code.
"""
from envd.client.connection import Client, connect
from envd.client.remote_vector_env import RemoteVecEnv

__all__ = ["connect", "Client", "RemoteVecEnv"]
