"""The driver's semantics, stepped by hand with inline workers and a manual learner."""

from __future__ import annotations

import json

import numpy as np
import pytest

from impala_lab import Impala, ImpalaConfig
from impala_lab.driver.checkpoint import read_checkpoint
from impala_lab.errors import ConfigError, ImpalaError, LearnerError, WorkerError
from tests.configs import SMALL
from tests.envs import FixedLengthEnv, RaisingEnv


def versions_of(run: Impala) -> list[int]:
    return [w.worker.weights_version for w in run.workers]


def test_step_concatenates_samples_to_train_batches():
    with Impala(ImpalaConfig(**SMALL), start_learner=False) as run:
        assert run.num_broadcasts == 1 and run.num_weight_syncs == 2
        sampled, trained = run.step()
        assert (sampled, trained) == (20, 0)
        assert run.learner.inqueue.qsize() == 1
        batch = run.learner.inqueue.queue[0]
        assert (batch.T, batch.B) == (10, 2)
        assert run.stats()["pipeline"]["batch_buffer_steps"] == 0
        assert run.learner.step() is True
        assert run.learner.outqueue.qsize() == 1
        sampled, trained = run.step()
        assert (sampled, trained) == (20, 20)
        assert run.num_steps_trained == 20 and run.num_steps_sampled == 40


def test_train_batch_size_not_a_multiple_of_samples_rounds_up():
    cfg = ImpalaConfig(**{**SMALL, "train_batch_size": 25, "num_workers": 3})
    with Impala(cfg, start_learner=False) as run:
        run.step()
        batch = run.learner.inqueue.queue[0]
        assert (batch.T, batch.B) == (10, 3)  # 3 samples of 10 steps reach 25
        assert cfg.train_batch_columns == 3


@pytest.mark.parametrize("interval", [1, 2, 3])
def test_broadcast_interval(interval):
    cfg = ImpalaConfig(**{**SMALL, "broadcast_interval": interval})
    with Impala(cfg, start_learner=False) as run:
        broadcasts = [run.num_broadcasts]
        for _ in range(6):
            run.step()
            broadcasts.append(run.num_broadcasts)
            run.learner.step(block_timeout=0)  # new weights after every driver step
        # Each step returns 2 samples; a broadcast happens on a return once the learner has
        # new weights and the previous broadcast served >= interval returns.
        sent, expected, updated = 0, [1], False
        for _ in range(6):
            count = expected[-1]
            for _ in range(2):
                if updated and sent >= interval:
                    count, sent, updated = count + 1, 0, False
                sent += 1
            expected.append(count)
            updated = True
        assert broadcasts == expected
        assert run.num_weight_syncs == 2 + 12


def test_workers_receive_the_broadcast_weights():
    with Impala(ImpalaConfig(**SMALL), start_learner=False) as run:
        assert versions_of(run) == [0, 0]
        run.step()
        run.learner.step()
        run.step()  # both returning workers get version 1
        assert versions_of(run) == [1, 1]
        run.step()
        batch = run.learner.inqueue.queue[-1]
        assert batch.policy_versions.tolist() == [1, 1]
        # the second step's samples were taken with version 0 while the learner had 1
        assert run.stats()["policy_lag"]["max"] == 1


def test_replay_counts():
    cfg = ImpalaConfig(**{**SMALL, "replay_proportion": 1.0, "replay_buffer_num_slots": 3,
                          "learner_queue_size": 100})
    with Impala(cfg, start_learner=False) as run:
        for _ in range(20):
            run.step()
        stats = run.stats()
        assert stats["num_steps_replayed"] == run.replay.num_replayed > 0
        assert run.replay.num_stored == 3
        # every new and every replayed batch went into a train batch of 20 steps
        total = run.num_steps_sampled + run.replay.num_replayed
        assert run.num_train_batches == total // 20


def test_stats_keep_the_seeds_keys():
    with Impala(ImpalaConfig(**SMALL), start_learner=False) as run:
        run.step()
        stats = run.stats()
    for key in ("sample_throughput", "train_throughput", "num_weight_syncs",
                "num_steps_replayed", "timing_breakdown", "learner_queue", "learner",
                "episode_return_mean", "episodes_total", "policy_lag", "num_worker_failures"):
        assert key in stats
    assert set(stats["timing_breakdown"]) >= {
        "optimizer_step_time_ms", "learner_grad_time_ms", "learner_load_time_ms",
        "learner_load_wait_time_ms", "learner_dequeue_time_ms"}


def test_the_training_page_explains_every_logged_metric():
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text()
    section = page.split("## Logged metrics explained", 1)[1].split("\n#", 1)[0]
    documented = set()
    for row in re.findall(r"^\| (`.+?`) \|", section, flags=re.M):
        documented |= set(re.findall(r"`([a-z_]+)`", row))
    # with evaluation on, so that its key (absent when off) is there too
    with Impala(ImpalaConfig(**SMALL, evaluation_interval=1), start_learner=False) as run:
        run.step()
        keys = set(run.stats())
    assert documented == keys, (f"docs/training.md lacks {sorted(keys - documented)}, documents "
                                f"{sorted(documented - keys)} that stats() does not have")


def test_full_learner_queue_without_a_learner_raises_instead_of_hanging():
    cfg = ImpalaConfig(**{**SMALL, "learner_queue_size": 1})
    with Impala(cfg, start_learner=False) as run:
        run.step()
        with pytest.raises(ImpalaError, match=r"learner queue is full.*learner.step\(\)"):
            run.step()


def test_learner_exception_reaches_the_driver_with_its_traceback():
    run = Impala(ImpalaConfig(**SMALL), start_learner=False)

    def broken_learn(batch):
        raise ZeroDivisionError("bad gradient math")

    run.policy.learn_on_batch = broken_learn
    run.learner.start()
    try:
        with pytest.raises(LearnerError) as info:
            for _ in range(200):
                run.step()
        text = str(info.value)
        assert "learner thread failed" in text and "bad gradient math" in text
        assert "broken_learn" in text  # the original traceback
    finally:
        run.stop()


def test_worker_error_is_raised_when_restarts_are_off():
    cfg = ImpalaConfig(**{**SMALL, "restart_failed_workers": False})
    with Impala(cfg, env_creator=lambda: RaisingEnv(every=15), start_learner=False) as run:
        with pytest.raises(WorkerError) as info:
            for _ in range(5):
                run.step()
        text = str(info.value)
        assert "boom at step 15" in text and "<lambda>" in text  # the env and the error
        assert "in step" in info.value.remote_traceback  # the env's own frame
        assert run.num_worker_failures == 1


def test_failed_workers_are_replaced():
    cfg = ImpalaConfig(**{**SMALL, "learner_queue_size": 100})
    with Impala(cfg, env_creator=lambda: RaisingEnv(every=15), start_learner=False) as run:
        for _ in range(6):
            run.step()
        # every worker fails in its second sample (env step 15): both originals were
        # replaced, training went on, and the run still has two workers
        assert run.num_worker_failures >= 2
        assert len(run.workers) == 2
        assert {w.index for w in run.workers}.isdisjoint({0, 1})
        assert run.num_steps_sampled >= 6 * 10
        assert run.stats()["num_worker_failures"] == run.num_worker_failures


def test_live_knobs_are_validated_applied_and_recorded():
    with Impala(ImpalaConfig(**SMALL), start_learner=False) as run:
        with pytest.raises(ConfigError, match="train_batch_size"):
            run.set_knobs(train_batch_size=10)
        with pytest.raises(ConfigError, match="lr=-1"):
            run.set_knobs(lr=-1.0)
        run.set_knobs(lr=0.01, num_sgd_iter=3, entropy_coeff=0.0, replay_proportion=0.0)
        assert float(run.policy.optimizer.learning_rate.numpy()) == pytest.approx(0.01)
        assert run.learner.minibatch_buffer.num_sgd_iter == 3
        assert run.stats()["knobs"]["lr"] == 0.01
        assert [c["knob"] for c in run.knob_changes] == [
            "lr", "num_sgd_iter", "entropy_coeff", "replay_proportion"]
        with pytest.raises(ConfigError, match="broadcast_interval"):
            run.set_knobs(lr=0.02, broadcast_interval=0)  # one bad value: nothing changes
        assert run.config.lr == 0.01 and len(run.knob_changes) == 4


def test_set_knobs_lists_every_knob_of_the_table():
    from impala_lab.knobs import KNOBS

    for knob in KNOBS.values():
        assert f"{knob.name} ({knob.kind}): {knob.help}" in Impala.set_knobs.__doc__


def test_a_driving_thread_owns_the_steps_and_others_read_its_pipeline_view():
    import threading

    with Impala(ImpalaConfig(**SMALL), start_learner=False) as run:
        seen: dict[str, object] = {}

        def watcher() -> None:
            seen["pipeline"] = run.stats()["pipeline"]
            try:
                run.step()
            except ImpalaError as exc:
                seen["error"] = str(exc)

        with run.driving_thread():
            run.step()
            left = run._last_pipeline_view
            thread = threading.Thread(target=watcher)
            thread.start()
            thread.join()
            assert seen["pipeline"] is left  # the copy the last step left, not a torn read
            assert "training in the background" in seen["error"]
        assert run._driver is None
        run.step()  # any thread may step again
    run = Impala(ImpalaConfig(**SMALL), start_learner=False)
    run.stop()
    run.stop()  # twice is fine
    with pytest.raises(ImpalaError, match="stopped"):
        run.step()


def test_checkpoint_round_trip_is_bitwise(tmp_path):
    cfg = ImpalaConfig(**SMALL)
    with Impala(cfg) as run:
        run.train(max_env_steps=400)
        run.stop()  # the learner thread ends, so the weights below are the saved ones
        path = run.save(tmp_path / "ckpt")
        weights, version = run.policy.get_weights()
        opt_state = run.policy.optimizer_state()
        counters = (run.num_steps_sampled, run.num_steps_trained, run.episodes_total)
    with Impala.restore(path) as restored:
        assert restored.config == cfg
        w2, v2 = restored.policy.get_weights()
        assert v2 == version
        for a, b in zip(weights, w2):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(opt_state, restored.policy.optimizer_state()):
            np.testing.assert_array_equal(a, b)
        assert (restored.num_steps_sampled, restored.num_steps_trained,
                restored.episodes_total) == counters
        # training resumes from there
        result = restored.train(lambda s: s["weights_version"] > version, max_seconds=60,
                                report_interval=0.05)
        assert result["stop_reason"] == "stop condition"
        assert restored.num_steps_sampled > counters[0]


def test_checkpoint_holds_no_pickle_and_tampering_is_named(tmp_path):
    with Impala(ImpalaConfig(**SMALL), start_learner=False) as run:
        path = run.save(tmp_path / "ckpt")
    state = json.loads((path / "state.json").read_text())
    assert state["config"]["train_batch_size"] == 20
    read_checkpoint(path)  # intact
    data = (path / "weights.npz").read_bytes()
    (path / "weights.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"weights\.npz: checksum mismatch"):
        read_checkpoint(path)
    (path / "state.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"state\.json: not a valid checkpoint"):
        read_checkpoint(path)


def test_episode_stats_come_from_the_workers():
    cfg = ImpalaConfig(**{**SMALL, "learner_queue_size": 100})
    with Impala(cfg, env_creator=lambda: FixedLengthEnv(length=4), start_learner=False) as run:
        for _ in range(3):
            run.step()
        stats = run.stats()
        # 2 workers x 3 samples x 10 steps = 60 steps = 15 episodes of 4 steps (+ partials)
        assert stats["episodes_total"] == 14
        assert stats["episode_return_mean"] == 4.0
        assert stats["episode_len_mean"] == 4.0


def test_workers_that_never_return_a_sample_stop_restarting():
    with Impala(ImpalaConfig(**SMALL), env_creator=lambda: RaisingEnv(every=1),
                start_learner=False) as run:
        with pytest.raises(ImpalaError, match=r"(?s)failed 4 times in a row.*boom at step 1"):
            for _ in range(20):
                run.step()
        assert run.num_worker_failures == 4


@pytest.mark.slow
def test_inline_impala_learns_cartpole_within_bounded_env_steps():
    # The tuned preset: the learner thread's timing makes even inline runs differ, and the
    # older recipe (Adam, grad_clip 40) sometimes collapsed to a return of 9.3.
    cfg = ImpalaConfig.tuned("CartPole-v1", backend="inline", seed=0)
    with Impala(cfg) as run:
        result = run.train(lambda s: s["episode_return_count"] >= 20
                           and s["episode_return_mean"] >= 195,
                           max_env_steps=1_500_000, report_interval=0.5)
    assert result["stop_reason"] == "stop condition", result["episode_return_mean"]


def test_policy_lag_at_training_counts_every_pass():
    # Three train batches sampled at version 0 wait in the queue; the learner then takes
    # every pass of each: the lag at the driver stays 0, at training it is the updates since.
    cfg = ImpalaConfig(**{**SMALL, "num_sgd_iter": 3, "learner_queue_size": 4})
    with Impala(cfg, start_learner=False) as run:
        for _ in range(3):
            run.step()
        assert run.stats()["policy_lag_at_training"]["max"] == 0
        steps = 0
        while run.learner.step(block_timeout=0):
            steps += 1
        stats = run.stats()
    assert steps >= 3 and stats["weights_version"] == steps
    assert stats["policy_lag"] == {"mean": 0.0, "max": 0}
    assert stats["policy_lag_at_training"] == {"mean": pytest.approx((steps - 1) / 2),
                                               "max": steps - 1}


def test_step_runs_the_loops_step_so_a_replacement_takes_over():
    # Exercise 4's last cell puts the student's driver_step in place of run.loop.step.
    assert not hasattr(Impala, "_step")
    with Impala(ImpalaConfig(**SMALL), start_learner=False) as run:
        calls = []
        run.loop.step = lambda timeout: calls.append(timeout) or (3, 2)
        assert run.step(0.25) == (3, 2) and calls == [0.25]
        assert (run.num_steps_sampled, run.num_steps_trained) == (3, 2)


def test_train_checks_its_stop_condition_between_reports():
    """A condition met between reports ends the run at the next check, not at the next
    report: with a 60 s report interval no report is ever taken, yet train() returns as
    soon as the condition holds (well before max_seconds, which would say "max_seconds")."""
    reports = []
    with Impala(ImpalaConfig(**SMALL)) as run:
        start = run.num_steps_sampled
        result = run.train(lambda s: s["num_steps_sampled"] >= start + 200, max_seconds=60,
                           report_interval=60, on_report=reports.append)
        assert result["stop_reason"] == "stop condition"
        assert result["num_steps_sampled"] >= start + 200
        assert reports == []  # stopped by a check between reports
