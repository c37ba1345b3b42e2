"""Policy lag as a dial: max_policy_lag drops stale batches, extra_policy_lag holds broadcasts
back; both live knobs; the lag distribution in stats(). Stepped by hand with inline workers."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from impala_lab import Impala, ImpalaConfig
from impala_lab.driver.driver_loop import DriverLoop
from impala_lab.errors import ConfigError

ONE_WORKER = dict(backend="inline", num_workers=1, num_envs_per_worker=1, sample_batch_size=10,
                  train_batch_size=10, learner_queue_size=100, seed=0)


def _spy_training(run: Impala) -> list[tuple[int, object]]:
    """Every batch the learner trains on, with the policy's version just before the update."""
    trained, learn = [], run.policy.learn_on_batch

    def spy(batch):
        trained.append((run.policy.version, batch))
        return learn(batch)

    run.policy.learn_on_batch = spy
    return trained


def _drain(run: Impala) -> None:
    while run.learner.inqueue.qsize():
        run.learner.step()


def test_a_batch_beyond_max_policy_lag_is_counted_and_never_trained_on():
    cfg = ImpalaConfig(**ONE_WORKER, max_sample_requests_in_flight_per_worker=2,
                       max_policy_lag=1)
    with Impala(cfg, start_learner=False) as run:
        trained = _spy_training(run)
        dropped, drop = [], run.loop.drop_for_lag
        run.loop.drop_for_lag = lambda worker, batch: (dropped.append(batch), drop(worker, batch))
        run.step()  # two version-0 batches: two train batches; two more requests at version 0
        assert run.learner.inqueue.qsize() == 2
        run.learner.step()
        run.learner.step()  # version 2: the two samples in flight are now 2 updates behind
        run.step()
        stats = run.stats()
        assert len(dropped) == 2 and stats["num_samples_dropped_for_lag"] == 20
        assert run.learner.inqueue.qsize() == 0 and run.num_train_batches == 2
        # still sampled env steps, with their lag counted; the worker got fresh weights
        assert stats["num_steps_sampled"] == 40
        assert stats["policy_lag_distribution"]["at_arrival"] == {"0": 2, "2": 2}
        assert run.workers[0].worker.weights_version == 2
        run.step()  # sampled at version 2: kept
        assert run.learner.inqueue.qsize() == 2
        _drain(run)
        assert run.stats()["num_samples_dropped_for_lag"] == 20
    assert len(trained) == 4
    for _, batch in trained:
        assert all(not np.array_equal(batch.obs, d.obs) for d in dropped)
        assert all(batch is not d for d in dropped)
    assert [v - int(b.policy_versions.min()) for v, b in trained] == [0, 1, 0, 1]


def test_the_lag_recorded_for_a_kept_batch_is_the_one_checked_at_its_arrival():
    # The learner trains while the driver puts a batch on its queue (here: at once, by hand),
    # so by the time the batch is recorded the learner is an update further on. The lag
    # counted is the one max_policy_lag was checked against: no kept batch shows past it.
    cfg = ImpalaConfig(**ONE_WORKER, max_sample_requests_in_flight_per_worker=2,
                       max_policy_lag=1)
    with Impala(cfg, start_learner=False) as run:
        put = run.loop.put_on_learner_queue

        def put_and_train(train_batch):
            put(train_batch)
            _drain(run)

        run.loop.put_on_learner_queue = put_and_train
        run.step()  # two version-0 batches, checked at versions 0 and 1; recorded at 1 and 2
        stats = run.stats()
        assert run.learner.weights_version == 2
        assert stats["num_samples_dropped_for_lag"] == 0
        assert stats["policy_lag_distribution"]["at_arrival"] == {"0": 1, "1": 1}
        assert run.loop.arrival_versions == {}


@pytest.mark.parametrize("extra", [0, 3])
def test_with_extra_policy_lag_k_every_batch_trained_after_k_updates_is_k_behind(extra):
    cfg = ImpalaConfig(**ONE_WORKER, max_sample_requests_in_flight_per_worker=1,
                       extra_policy_lag=extra)
    with Impala(cfg, start_learner=False) as run:
        trained = _spy_training(run)
        for _ in range(25):
            run.step()
            _drain(run)
        stats = run.stats()
    lags = [v - int(b.policy_versions.min()) for v, b in trained if v >= extra]
    assert len(lags) >= 20
    if extra:
        assert min(lags) >= extra
        assert stats["policy_lag_at_training"]["mean"] >= extra - 1  # window holds the start
        assert min(int(k) for k in stats["policy_lag_distribution"]["at_training"]) == 0
    else:
        assert max(lags) <= 1  # one request in flight: at most one update behind
    assert stats["policy_lag_at_training"]["max"] == max(lags)


def _loop(extra: int) -> DriverLoop:
    config = SimpleNamespace(extra_policy_lag=extra)
    return DriverLoop(config, replay=None, learner=None, run_stats=None)


def test_held_back_weights_publish_the_newest_weights_at_least_k_updates_old():
    loop = _loop(2)
    published = []
    for version, extra in [(0, 2), (1, 2), (2, 2), (3, 2), (4, 2), (5, 0), (6, 0), (7, 4),
                           (10, 4), (11, 4)]:
        loop.config.extra_policy_lag = extra
        chosen = loop.held_back_weights(f"w{version}", version)
        if chosen is not None:
            loop.weights_ref = chosen
        published.append(None if chosen is None else chosen[1])
        assert chosen is None or chosen == (f"w{chosen[1]}", chosen[1])
    # 0: the first broadcast publishes the oldest; 1, 2: nothing 2 behind yet; 5: extra lag 0
    # publishes the newest and empties the history; 7, 10: raised to 4, the workers keep 6
    # until a version read since is 4 behind
    assert published == [0, None, None, 1, 2, 5, 6, None, None, 7]
    assert [v for _, v in loop.weights_history] == [10, 11]


def test_both_lag_knobs_are_live_and_validated_against_each_other():
    with Impala(ImpalaConfig(**ONE_WORKER), start_learner=False) as run:
        run.set_knobs(extra_policy_lag=4, max_policy_lag=8)
        assert (run.config.extra_policy_lag, run.config.max_policy_lag) == (4, 8)
        assert run.stats()["knobs"]["extra_policy_lag"] == 4
        with pytest.raises(ConfigError, match=r"max_policy_lag=3 is invalid: with "
                                              r"extra_policy_lag=4 .*set max_policy_lag above"):
            run.set_knobs(max_policy_lag=3)
        with pytest.raises(ConfigError, match="extra_policy_lag=-1 is invalid: it must be a "
                                              "non-negative integer"):
            run.set_knobs(extra_policy_lag=-1)
        assert run.config.max_policy_lag == 8


def test_the_distribution_counts_lags_and_stays_out_of_the_history_rows():
    from impala_lab.driver.run_stats import history_row, lag_counts

    assert lag_counts([3, 0, 3, 12]) == {"0": 1, "3": 2, "12": 1}
    assert lag_counts([]) == {}
    with Impala(ImpalaConfig(**ONE_WORKER), start_learner=False) as run:
        run.step()
        row = history_row(run.stats())
    assert row["num_samples_dropped_for_lag"] == 0
    assert not any(k.startswith("policy_lag_distribution") for k in row)
