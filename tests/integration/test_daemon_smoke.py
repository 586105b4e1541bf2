"""A first end-to-end check: one client, one env, through a real daemon."""
import envd


def test_step_through_the_daemon_matches_in_process(daemon):
    with daemon.connect() as client, envd.make("CartPole-v1", 8, seed=1) as local:
        remote = client.make("CartPole-v1", 8, seed=1)
        assert remote.reset()[0].tobytes() == local.reset()[0].tobytes()
        for _ in range(50):
            actions = local.action_space.sample()
            for a, b in zip(remote.step(actions)[:4], local.step(actions)[:4]):
                assert a.tobytes() == b.tobytes()
