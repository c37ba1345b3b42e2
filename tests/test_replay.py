"""Tests of impala_lab.driver.replay_mixer.ReplayMixer."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest

from impala_lab.driver.replay_mixer import ReplayMixer
from impala_lab.errors import ConfigError


@dataclass(frozen=True)
class B:
    """A stand-in batch: only `count` matters to the mixer."""

    id: int
    count: int = 50


def new_pairs(n: int, count: int = 50):
    return [(f"w{i % 3}", B(i, count)) for i in range(n)]


def split_by_new(out):
    """[(new_batch, [replays...]), ...] from the mixer's output."""
    groups = []
    for worker, batch in out:
        if worker is None:
            groups[-1][1].append(batch)
        else:
            groups.append((batch, []))
    return groups


def test_no_replay_before_threshold_then_replays():
    # threshold = ceil(500 / 50) = 10 stored batches; replays once more than 10 are stored.
    mixer = ReplayMixer(1.0, 12, 500, 50, seed=0)
    assert mixer.replay_threshold == 10
    groups = split_by_new(mixer.mix(new_pairs(15)))
    assert [len(r) for _, r in groups] == [0] * 10 + [1] * 5
    # Every replay comes from the batches stored so far, the new one included.
    for new, replays in groups:
        for r in replays:
            assert r.id <= new.id and r.id > new.id - 12


def test_threshold_with_uneven_division():
    mixer = ReplayMixer(1.0, 12, 510, 50, seed=0)  # ceil(10.2) = 11
    assert mixer.replay_threshold == 11
    counts = [len(r) for _, r in split_by_new(mixer.mix(new_pairs(13)))]
    assert counts == [0] * 11 + [1] * 2


def test_order_new_pair_first_then_its_replays_and_check_sees_new_batch():
    mixer = ReplayMixer(1.0, 3, 100, 50, seed=1)  # threshold 2: replays from the 3rd batch
    gen = mixer.mix(new_pairs(3))
    assert next(gen) == ("w0", B(0))
    assert mixer.num_stored == 0  # stored only after the consumer took the new pair
    assert next(gen) == ("w1", B(1))
    assert mixer.num_stored == 1
    assert next(gen) == ("w2", B(2))
    worker, replay = next(gen)  # stored 3 > 2 counts the new batch: a replay follows
    assert worker is None and replay in (B(0), B(1), B(2))
    assert mixer.num_stored == 3 and mixer.can_replay()
    assert list(gen) == []


def test_mean_replays_per_new_batch_matches_proportion():
    n = 20000
    for p in (0.25, 1.0, 1.5):
        mixer = ReplayMixer(p, 11, 500, 50, seed=123)
        groups = split_by_new(mixer.mix(new_pairs(n + 10)))[10:]  # after the warm-up
        counts = [len(r) for _, r in groups]
        frac = p - math.floor(p)
        var = frac * (1 - frac)  # replays = floor(p) + Bernoulli(frac)
        mean = sum(counts) / n
        assert abs(mean - p) <= 5 * math.sqrt(var / n) + 1e-12, (p, mean)
        assert set(counts) <= {math.floor(p), math.ceil(p)}
        assert mixer.num_replayed_batches == sum(counts)
        assert mixer.num_replayed == 50 * sum(counts)


def test_replays_are_uniform_over_the_store():
    mixer = ReplayMixer(1.0, 11, 500, 50, seed=7)
    hits = [0] * 11
    n = 22000
    current = -1
    for worker, batch in mixer.mix(new_pairs(n + 10)):
        if worker is None:
            # The store holds the last 11 new batches; position 10 is the newest.
            hits[batch.id - (current - 10)] += 1
        else:
            current = batch.id
    expected = n / 11
    sigma = math.sqrt(n * (1 / 11) * (10 / 11))
    assert all(abs(h - expected) <= 5 * sigma for h in hits), hits


def test_fifo_eviction():
    mixer = ReplayMixer(0.0, 4, 50, 50)
    out = list(mixer.mix(new_pairs(7)))
    assert [b.id for _, b in out] == list(range(7))  # proportion 0: no replay at all
    assert mixer.num_stored == 4 and mixer.capacity == 4
    assert [b.id for b in mixer._store] == [3, 4, 5, 6]
    # With replay on, replays only ever come from the 4 newest batches.
    mixer = ReplayMixer(3.0, 4, 150, 50, seed=5)
    current = -1
    for worker, batch in mixer.mix(new_pairs(300)):
        if worker is None:
            assert current - 3 <= batch.id <= current
        else:
            current = batch.id


def test_no_store_when_slots_zero():
    mixer = ReplayMixer(0.0, 0, 500, 50)
    out = list(mixer.mix(new_pairs(30)))
    assert out == new_pairs(30)
    assert mixer.num_stored == 0 and not mixer.can_replay()
    assert mixer.num_replayed == 0 and mixer.num_replayed_batches == 0


def test_determinism_by_seed():
    def run(seed):
        mixer = ReplayMixer(0.7, 20, 500, 50, seed=seed)
        return [(w, b.id) for w, b in mixer.mix(new_pairs(200))]

    assert run(42) == run(42)
    assert run(42) != run(43)


def test_matches_reference_of_the_seed():
    """RLlib's _augment_with_replay plus its driver's store, written out independently."""
    p, slots, t, s, seed = 1.3, 13, 500, 50, 9
    rng = random.Random(seed)
    store, expected, replayed = [], [], 0
    for worker, batch in new_pairs(100, count=37):
        expected.append((worker, batch))
        store.append(batch)
        if len(store) > slots:
            store.pop(0)
        if len(store) > math.ceil(t / s):
            f = p
            while rng.random() < f:
                f -= 1
                b = rng.choice(store)
                replayed += b.count
                expected.append((None, b))
    mixer = ReplayMixer(p, slots, t, s, seed=seed)
    assert list(mixer.mix(new_pairs(100, count=37))) == expected
    assert mixer.num_replayed == replayed


def test_replay_proportion_is_settable_live():
    mixer = ReplayMixer(0.0, 11, 500, 50, seed=3)
    gen = mixer.mix(new_pairs(100))
    first = [next(gen) for _ in range(30)]
    assert all(w is not None for w, _ in first)
    mixer.replay_proportion = 2.0
    rest = list(gen)
    # The generator resumes after new batch 29: its two replays come first, then each
    # later new batch is followed by exactly two replays.
    assert [w for w, _ in rest[:3]] == [None, None, "w0"]
    groups = split_by_new(rest[2:])
    assert len(groups) == 70 and all(len(r) == 2 for _, r in groups)
    assert mixer.replay_proportion == 2.0
    with pytest.raises(ValueError, match=r"replay_proportion=-0\.5 is invalid"):
        mixer.replay_proportion = -0.5
    with pytest.raises(ValueError, match="replay_proportion=nan"):
        mixer.replay_proportion = float("nan")
    assert mixer.replay_proportion == 2.0  # a refused value changes nothing
    small = ReplayMixer(0.0, 3, 500, 50)
    with pytest.raises(ConfigError, match="set replay_buffer_num_slots to at least 11"):
        small.replay_proportion = 0.5


def test_too_small_error_message():
    with pytest.raises(ValueError) as info:
        ReplayMixer(0.5, 4, 500, 50)
    msg = str(info.value)
    assert isinstance(info.value, ConfigError)
    assert "replay_buffer_num_slots=4" in msg
    assert "replay_proportion=0.5" in msg
    assert "train_batch_size = 500" in msg
    assert "sample_batch_size = 200 env steps" in msg
    assert "set replay_buffer_num_slots to at least 11" in msg
    assert "or replay_proportion=0" in msg


def test_too_small_boundaries():
    ReplayMixer(0.5, 11, 500, 50)  # 11 > ceil(500/50) = 10: fine
    with pytest.raises(ValueError, match="at least 11"):
        ReplayMixer(0.5, 10, 500, 50)  # RLlib's own check: 10 * 50 <= 500
    # RLlib let 11 slots of 50 through for 510, but they could never replay
    # (11 stored is never > ceil(510 / 50) = 11); the mixer refuses them.
    with pytest.raises(ValueError, match="at least 12"):
        ReplayMixer(0.5, 11, 510, 50)
    ReplayMixer(0.5, 12, 510, 50)
    ReplayMixer(0.0, 0, 500, 50)  # no replay wanted: any size works


@pytest.mark.parametrize(
    "args, match",
    [
        ((-0.1, 11, 500, 50), r"replay_proportion=-0\.1 is invalid"),
        ((0.0, -1, 500, 50), "replay_buffer_num_slots=-1 is invalid"),
        ((0.0, 1.5, 500, 50), "replay_buffer_num_slots=1.5 is invalid"),
        ((0.0, 1, 0, 50), "train_batch_size=0 is invalid"),
        ((0.0, 1, 500, -5), "sample_batch_size=-5 is invalid"),
        ((float("inf"), 11, 500, 50), "replay_proportion=inf is invalid"),
    ],
)
def test_validation(args, match):
    with pytest.raises(ValueError, match=match):
        ReplayMixer(*args)
