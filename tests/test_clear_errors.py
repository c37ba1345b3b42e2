"""Mistakes that used to end in a traceback are one line naming the field and the fix."""

from __future__ import annotations

import importlib.util

import pytest

from impala_lab import ImpalaConfig
from impala_lab.cli.main import main
from impala_lab.errors import ConfigError


@pytest.mark.parametrize("env, package", [
    ("MinAtar/Pong-v1", "pip install 'impala_lab[minatar]'"),
    ("LunarLanderX-v3", "pip install 'gymnasium[box2d]'"),
])
def test_an_unknown_env_of_a_known_family_names_its_package(env, package):
    with pytest.raises(ConfigError, match=rf"^env='{env}' is invalid: gymnasium does not know "
                                          rf"this env id; .*{package.replace('[', '.')}"):
        ImpalaConfig(env=env)


def test_a_typo_still_gets_did_you_mean():
    with pytest.raises(ConfigError, match=r"did you mean 'CartPole-v1'"):
        ImpalaConfig(env="CartPol-v1")


def test_backend_ray_without_ray_is_a_config_error(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(ConfigError, match=r"^backend='ray' is invalid: Ray is not installed: "
                                          r"pip install 'impala_lab\[ray\]'"):
        ImpalaConfig(env="CartPole-v1", backend="ray")
    assert main(["train", "--backend", "ray", "--out", "unused"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Ray is not installed" in err


def test_a_seed_too_large_for_tensorflow_is_one_line_from_the_cli(capsys):
    assert main(["train", "--seed", str(2**63), "--out", "unused"]) == 2
    err = capsys.readouterr().err
    assert err == ("impala-lab: error: seed=9223372036854775808 is invalid: use an integer in "
                   "[0, 2**63), or None for a random seed (TensorFlow keeps seeds as int64)\n")
