"""info["envd_log"]'s values: the rows of the episode log where an episode
ended, 0 elsewhere, whichever way envd.vec_info.ended_columns builds them
(np.where on short logs and where many ended, an indexed copy on long logs
where few did)."""

from __future__ import annotations

import numpy as np
import pytest

from envd.vec_info import _INDEX_MAX_SHARE, _WHERE_MAX_ROWS, ended_columns


@pytest.mark.parametrize("rows", [1, 64, _WHERE_MAX_ROWS, _WHERE_MAX_ROWS + 1, 4096])
@pytest.mark.parametrize("share", [0.0, 0.01, 1 / _INDEX_MAX_SHARE, 0.5, 1.0])
def test_ended_columns_equal_np_where(rows, share):
    rng = np.random.default_rng(rows)
    log = rng.normal(size=(rows, 5)) * 1e6
    log[0, 1], log[-1, 2], log[rows // 2, 3] = np.nan, np.inf, -0.0
    dones = np.zeros(rows, bool)
    dones[rng.permutation(rows)[:round(share * rows)]] = True
    expected = np.where(dones[:, None], log, 0.0)

    columns = ended_columns(log, dones)

    assert columns.dtype == np.float64 and len(columns) == 5
    for k, column in enumerate(columns):
        np.testing.assert_array_equal(column, expected[:, k])
        assert not np.shares_memory(column, log)  # the log's rows change at the next step
    assert np.signbit(columns[3][rows // 2]) == bool(dones[rows // 2])
