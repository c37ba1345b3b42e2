"""bench.startup: medians, ratios to the TensorFlow import and the targets (no runs)."""

from __future__ import annotations

import pytest

from bench import startup


def test_the_summary_gives_medians_ratios_and_targets():
    rounds = [{"import_tensorflow_s": 2.0, "first_sample_s": 1.2, "first_train_s": 2.4},
              {"import_tensorflow_s": 3.0, "first_sample_s": 0.9, "first_train_s": 3.3},
              {"import_tensorflow_s": 2.5, "first_sample_s": 1.0, "first_train_s": 2.5}]
    s = startup.summarize(rounds)
    assert s["median"] == {"import_tensorflow_s": 2.5, "first_sample_s": 1.0,
                           "first_train_s": 2.5}
    # per round first, then the median: 0.6, 0.3, 0.4 and 1.2, 1.1, 1.0
    assert s["ratio_to_import_tensorflow"] == {"first_sample_s": 0.4, "first_train_s": 1.1}
    assert s["targets"]["first_sample_s"] == {"limit_s": 1.0, "met": True}
    assert s["targets"]["first_train_s"] == {"limit_s": 2.5, "met": True}
    text = startup.markdown(s)
    assert "| process start to the first sample | 1.00 | 0.40 | <= 1 s: met |" in text
    assert "| `python -c \"import tensorflow\"` | 2.50 | 1.00 | |" in text


def test_a_slow_start_fails_its_target_in_the_table():
    s = startup.summarize([{"import_tensorflow_s": 2.0, "first_sample_s": 3.1,
                            "first_train_s": 4.0}])
    assert "| process start to the first train step | 4.00 | 2.00 | <= 2.5 s: not met |" in \
        startup.markdown(s)


def test_rounds_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        startup.main(["--rounds", "0"])
    assert "--rounds=0: it must be >= 1" in capsys.readouterr().err
