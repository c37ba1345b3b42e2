"""Checkpoints under faults: kills at random moments, a full disk, saves during training.

`Impala.save` writes a new directory beside the target, fsyncs it and swaps it in with two
renames (`impala_lab.driver.checkpoint.write_checkpoint`); these tests hold that the previous
checkpoint
always survives, that a save during background training is one learner step's snapshot, that
``restore(path, lr=...)`` trains at the new lr, and that damaged counters are refused.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from impala_lab import Impala, ImpalaConfig
from impala_lab.driver.checkpoint import prev_checkpoint_path, read_checkpoint
from impala_lab.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
INLINE = dict(backend="inline", num_workers=2, num_envs_per_worker=2, sample_batch_size=10,
              train_batch_size=40, model=(16,), seed=0)


def leftovers(path: Path) -> list[str]:
    """Entries beside ``path`` that a save in progress creates (``.tmp-*``, ``.prev``)."""
    return sorted(p.name for p in path.parent.iterdir()
                  if p.name.startswith(path.name + ".tmp") or p.name == path.name + ".prev")


def checkpoint_value(path: Path) -> int:
    """The value a SAVE_LOOP save wrote (every weight, the version and the counters equal it)."""
    state, weights, opt_state = read_checkpoint(path)
    value = state["policy_version"]
    assert state["counters"]["num_steps_sampled"] == value
    assert state["counters"]["episodes_total"] == value
    for w in weights:
        assert np.all(w == np.float32(value)), (value, w)
    assert int(opt_state[0]) == value  # the optimizer's iterations
    return value


# A TF-free process that saves in a loop through write_checkpoint, the function that does all of
# Impala.save's file work; a save number i writes weights filled with i, version i, counters i.
SAVE_LOOP = textwrap.dedent("""
    import sys
    import numpy as np
    from impala_lab.driver.checkpoint import read_checkpoint, write_checkpoint

    template, path, start = sys.argv[1], sys.argv[2], int(sys.argv[3])
    state, weights, opt_state = read_checkpoint(template)
    print("ready", flush=True)
    i = start
    while True:
        state["policy_version"] = i
        state["counters"].update(num_steps_sampled=i, episodes_total=i)
        opt_state[0] = np.asarray(i, dtype=opt_state[0].dtype)
        write_checkpoint(path, {k: v for k, v in state.items() if k != "sha256"},
                         [np.full_like(w, i) for w in weights], opt_state)
        print(i, flush=True)
        i += 1
""")


@pytest.mark.slow
def test_a_save_killed_at_20_random_moments_leaves_the_old_or_the_new_checkpoint(tmp_path):
    template = tmp_path / "template"
    with Impala(ImpalaConfig(**INLINE), start_learner=False) as run:
        run.save(template)
    path = tmp_path / "out" / "checkpoint"
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    known = None  # the value the checkpoint held before this round
    mid_save = 0
    for round_ in range(20):
        start = 1000 * (round_ + 1)
        proc = subprocess.Popen([sys.executable, "-c", SAVE_LOOP, str(template), str(path),
                                 str(start)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env)
        try:
            assert proc.stdout.readline().strip() == "ready", (
                f"round {round_}: the saving process failed to start:\n{proc.stderr.read()}")
            time.sleep(rng.uniform(0.0, 0.15))
            proc.send_signal(signal.SIGKILL)
            out, err = proc.communicate(timeout=30)
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
        assert proc.returncode == -signal.SIGKILL, (
            f"round {round_}: the saving process ended before the kill:\n{err}")
        done = [int(line) for line in out.split()]
        mid_save += bool(leftovers(path))
        if known is None and not done and not path.exists() and not prev_checkpoint_path(
                path).exists():
            continue  # killed before the very first save put anything in place
        # The old state (the last finished save) or the new one (the save in progress).
        value = checkpoint_value(path)
        last = done[-1] if done else known
        allowed = {last, (last + 1) if done else start}
        assert value in allowed, (f"seed {seed}, round {round_}: the checkpoint holds save "
                                  f"{value}, expected one of {sorted(allowed)}; beside it: "
                                  f"{leftovers(path)}")
        known = value
    print(f"seed {seed}: {mid_save} of 20 kills caught a save in progress")
    assert known is not None, f"seed {seed}: no save finished in 20 rounds"
    assert mid_save >= 3, (f"seed {seed}: only {mid_save} of 20 kills caught a save in "
                           "progress; the test did not test much")
    # The next save cleans what the killed ones left, and leaves nothing beside the checkpoint.
    with Impala(ImpalaConfig(**INLINE), start_learner=False) as run:
        run.save(path)
        weights, _ = run.policy.get_weights()
    assert leftovers(path) == []
    assert sorted(p.name for p in path.iterdir()) == ["optimizer.npz", "state.json",
                                                      "weights.npz"]
    with Impala.restore(path, start_learner=False) as restored:
        for a, b in zip(weights, restored.policy.get_weights()[0]):
            np.testing.assert_array_equal(a, b)


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 4 MiB tmpfs (``mount -t tmpfs``, needs root); skipped only where mounting is refused."""
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here to fill a disk ({proc.stderr.strip()}); "
                    "this test needs root (or CAP_SYS_ADMIN)")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_a_full_disk_during_an_overwrite_leaves_the_old_checkpoint(small_tmpfs):
    # A model whose weights.npz (about 0.3 MB) fits in the space left, optimizer.npz (Adam:
    # twice as large) no more: a writer that replaced files one by one would leave new
    # weights beside the old checksums.
    config = ImpalaConfig(**{**INLINE, "model": (128, 128)})
    path = small_tmpfs / "checkpoint"
    with Impala(config, start_learner=False) as run:
        run.save(path)
        old_weights, old_version = run.policy.get_weights()
        old_opt = run.policy.optimizer_state()
        weights_size = (path / "weights.npz").stat().st_size
        # A different state to save: other weights, another version.
        run.policy.set_weights([w + 1.0 for w in old_weights], old_version + 5)
        filler = small_tmpfs / "filler"
        with open(filler, "wb") as fh:
            fh.write(b"\0" * (free_bytes(small_tmpfs) - int(1.3 * weights_size)))
        with pytest.raises(OSError) as info:
            run.save(path)
        assert info.value.errno == 28  # ENOSPC
        assert leftovers(path) == []  # the partial new checkpoint was removed
        state, weights, opt_state = read_checkpoint(path)
        assert state["policy_version"] == old_version
        for a, b in zip(old_weights + old_opt, weights + opt_state):
            np.testing.assert_array_equal(a, b)
        # Space again: the same save now replaces the old checkpoint.
        filler.unlink()
        run.save(path)
        assert read_checkpoint(path)[0]["policy_version"] == old_version + 5
        assert leftovers(path) == []


def test_a_save_during_background_training_is_one_learner_steps_snapshot(tmp_path):
    torn = []
    with Impala(ImpalaConfig(**INLINE)) as run:
        run.start(max_seconds=120)
        try:
            deadline = time.monotonic() + 60
            while run.policy.version < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            versions = set()
            for i in range(30):
                path = run.save(tmp_path / f"ckpt{i}")
                state, _, opt_state = read_checkpoint(path)
                version, iterations = state["policy_version"], int(opt_state[0])
                versions.add(version)
                if version != iterations:
                    torn.append((version, iterations))
                time.sleep(0.01)
        finally:
            run.pause()
    assert run.policy.optimizer.variables[0].name == "iteration"
    assert not torn, f"{len(torn)} of 30 saves were torn (version, optimizer iterations): {torn}"
    assert len(versions) > 5, f"the learner hardly trained during the saves: {sorted(versions)}"


def test_restore_with_lr_and_entropy_coeff_trains_with_them(tmp_path):
    with Impala(ImpalaConfig(**INLINE), start_learner=False) as run:
        run.save(tmp_path / "ckpt")
        run.set_knobs(lr=0.002)  # a live change is saved and restored too
        run.save(tmp_path / "knob")
    with Impala.restore(tmp_path / "ckpt", lr=0.1, entropy_coeff=0.5,
                        start_learner=False) as restored:
        policy = restored.policy
        assert restored.config.lr == 0.1 and restored.config.entropy_coeff == 0.5
        assert float(policy.optimizer.learning_rate.numpy()) == pytest.approx(0.1)
        assert float(policy.lr.numpy()) == pytest.approx(0.1)
        assert float(policy.entropy_coeff.numpy()) == pytest.approx(0.5)
        assert restored.stats()["knobs"]["lr"] == 0.1
    with Impala.restore(tmp_path / "knob", start_learner=False) as restored:
        assert restored.config.lr == 0.002
        assert float(restored.policy.optimizer.learning_rate.numpy()) == pytest.approx(0.002)


def test_an_invalid_override_on_restore_says_so(tmp_path):
    with Impala(ImpalaConfig(**INLINE), start_learner=False) as run:
        run.save(tmp_path / "ckpt")
    with pytest.raises(ConfigError, match=r"state\.json: the checkpoint's config with the "
                       r"overrides is invalid: lr=-1"):
        Impala.restore(tmp_path / "ckpt", lr=-1)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("counters") / "ckpt"
    with Impala(ImpalaConfig(**INLINE), start_learner=False) as run:
        run.save(path)
    return path


@pytest.mark.parametrize("field", ["num_steps_sampled", "num_steps_trained",
                                   "num_weight_syncs", "episodes_total", "elapsed_s",
                                   "policy_version"])
@pytest.mark.parametrize("value", [-1, float("nan"), float("inf"), 1e300,
                                   pytest.param(10**300, id="10**300"), 2.5, "7", True, None])
def test_checkpoint_counters_that_cannot_be_are_refused_naming_field_value_and_file(
        saved, tmp_path, field, value):
    if field == "elapsed_s" and value == 2.5:
        value = -2.5  # 2.5 s is a fine elapsed time
    path = tmp_path / "ckpt"
    path.mkdir()
    for name in ("weights.npz", "optimizer.npz"):
        (path / name).write_bytes((saved / name).read_bytes())
    state = json.loads((saved / "state.json").read_text())
    if field == "policy_version":
        state[field] = value
    else:
        state["counters"][field] = value
    (path / "state.json").write_text(json.dumps(state))
    shown = "policy_version" if field == "policy_version" else f"counters.{field}"
    with pytest.raises(ValueError) as info:
        Impala.restore(path, start_learner=False)
    message = str(info.value)
    assert str(path / "state.json") in message
    assert shown in message
    assert f"{shown}={value!r} is invalid" in message


def test_sane_counters_restore(saved):
    state, _, _ = read_checkpoint(saved)
    assert state["counters"]["elapsed_s"] >= 0


def test_a_checkpoint_missing_beside_its_prev_reads_the_prev(tmp_path, caplog):
    path = tmp_path / "ckpt"
    with Impala(ImpalaConfig(**INLINE), start_learner=False) as run:
        run.save(path)
        version = run.policy.version
    os.rename(path, prev_checkpoint_path(path))  # a save killed between its two renames
    caplog.set_level(logging.WARNING, logger="impala_lab")
    assert read_checkpoint(path)[0]["policy_version"] == version
    assert re.search(r"a save was interrupted .* reading the previous checkpoint", caplog.text)
    with Impala.restore(path, start_learner=False) as restored:
        assert restored.policy.version == version
        restored.save(path)  # the next save puts a checkpoint in place and drops .prev
    assert path.is_dir() and leftovers(path) == []


def test_a_damaged_checkpoint_falls_back_to_prev_only_when_asked(tmp_path):
    path = tmp_path / "ckpt"
    with Impala(ImpalaConfig(**INLINE), start_learner=False) as run:
        run.save(path)
        prev = prev_checkpoint_path(path)
        prev.mkdir()
        for name in ("weights.npz", "optimizer.npz", "state.json"):
            (prev / name).write_bytes((path / name).read_bytes())
    data = (path / "weights.npz").read_bytes()
    (path / "weights.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"weights\.npz: checksum mismatch"):
        read_checkpoint(path)
    read_checkpoint(path, fallback_to_prev=True)
    with Impala.restore(path, fallback_to_prev=True, start_learner=False):
        pass


def test_save_never_replaces_a_directory_that_is_not_a_checkpoint(tmp_path):
    precious = tmp_path / "results"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with Impala(ImpalaConfig(**INLINE), start_learner=False) as run, pytest.raises(
            ValueError, match=r"results: holds files that are not part of a checkpoint "
            r"\(notes\.txt\)"):
        run.save(precious)
    assert (precious / "notes.txt").read_text() == "keep me"
    assert leftovers(precious) == []


def test_a_restored_run_samples_with_the_checkpoints_weights_from_its_first_request(tmp_path):
    """`Impala.restore` starts the workers with the checkpoint's weights: no batch sampled
    by fresh initial weights is queued for the learner or counted (a resumed run used to
    train on a random policy first: trailing mean 209 -> 33.5)."""
    from impala_lab.actor.numpy_model import NumpyModel

    config = ImpalaConfig(**INLINE)
    with Impala(config, start_learner=False) as run:
        for _ in range(3):
            run.step()
        weights, version = run.policy.get_weights()
        trained = [w + np.float32(0.5) for w in weights]  # far from any fresh start
        run.policy.set_weights(trained, version + 7)
        run.save(tmp_path / "ckpt")
        saved_steps = run.num_steps_sampled
        spaces = (run.observation_space, run.action_space)
    assert saved_steps > 0
    with Impala.restore(tmp_path / "ckpt", start_learner=False) as restored:
        assert restored.num_steps_sampled == saved_steps
        for _ in range(6):  # the learner is not started: every train batch stays queued
            restored.step()
        batches = []
        while not restored.learner.inqueue.empty():
            batches.append(restored.learner.inqueue.get_nowait())
        buffered = restored.stats()["pipeline"]["batch_buffer_steps"]
        counted = restored.num_steps_sampled - saved_steps
    assert len(batches) >= 2
    checkpoint_model, fresh_model = (NumpyModel(*spaces, config.model_spec) for _ in "ab")
    checkpoint_model.set_weights(trained)
    fresh_model.set_weights(weights)
    for batch in batches:
        assert (batch.policy_versions == version + 7).all()
        obs = batch.obs.reshape(-1, *batch.obs.shape[2:])
        logits = batch.behaviour_logits.reshape(len(obs), -1)
        np.testing.assert_allclose(logits, checkpoint_model.logits(obs), rtol=1e-5, atol=1e-5)
        assert not np.allclose(logits, fresh_model.logits(obs), atol=1e-3)
    # every env step counted since the restore is in those batches or the batch buffer
    assert counted == sum(b.obs.shape[0] * b.obs.shape[1] for b in batches) + buffered
