"""How a MultiClient spreads num_envs over its daemons (split_envs): in
proportion to their threads, largest remainder first, at least one env per
daemon when there are enough, deterministic."""
from __future__ import annotations

import itertools

import pytest

import envd
from envd.client.multi import split_envs


@pytest.mark.parametrize("weights,num_envs,expected", [
    ([1, 2], 5, [2, 3]),          # quotas 1.67 and 3.33: the larger remainder rounds up
    ([1, 2], 3, [1, 2]),
    ([1, 2], 6, [2, 4]),
    ([1, 2], 2, [1, 1]),          # everyone gets one before proportions
    ([1, 2], 1, [0, 1]),          # fewer envs than daemons: the heaviest first
    ([2, 2, 1], 2, [1, 1, 0]),    # ... the earlier among equals
    ([1, 1, 1], 7, [3, 2, 2]),    # equal remainders: the earlier daemon
    ([0, 1, 2], 8, [2, 2, 4]),    # 0 threads counts as 1: quotas 2, 2, 4
    ([8, 1], 4, [3, 1]),          # quota 0.44 for the light one: it still gets one
    ([100, 1, 1], 3, [1, 1, 1]),
    ([4], 10, [10]),
])
def test_split_numbers(weights, num_envs, expected):
    assert split_envs(weights, num_envs) == expected


def test_split_properties_over_many_cases():
    for weights in itertools.product([0, 1, 2, 3, 8], repeat=3):
        for num_envs in range(1, 40):
            counts = split_envs(list(weights), num_envs)
            assert sum(counts) == num_envs
            assert counts == split_envs(list(weights), num_envs)  # deterministic
            if num_envs >= len(weights):
                assert min(counts) >= 1
            else:
                assert counts.count(1) == num_envs and counts.count(0) == len(weights) - num_envs
            w = [max(1, x) for x in weights]
            quotas = [num_envs * x / sum(w) for x in w]
            if min(quotas) >= 1:  # no floor of one env moved anything: each within one env
                assert all(abs(c - q) < 1 for c, q in zip(counts, quotas)), (weights, counts)

def test_no_daemon():
    with pytest.raises(envd.InvalidArgumentError):
        split_envs([], 3)


@pytest.mark.parametrize("endpoints", [[], "not-a-list", [5], ["ipc:///x", None]])
def test_multiclient_refuses_bad_endpoint_lists(endpoints):
    with pytest.raises(envd.InvalidArgumentError):
        envd.MultiClient(endpoints)
