"""pip constraints that pin each requirement of pyproject.toml to its declared lower bound.

    python tools/oldest_constraints.py dev ray > constraints.txt

For the project's dependencies and the optional-dependency groups named on the command line,
every requirement with a ``>=X`` bound becomes ``name==X`` (its environment marker kept), so
``pip install -c constraints.txt -e '.[dev,ray]'`` installs exactly the oldest versions the
project claims to support. ``make test-oldest`` (.ci/test-oldest) runs the tests against them;
a bound that is not a released version (``tensorflow>=2.16`` where 2.16.0 was never released)
fails there instead of being rounded up silently. Requirements without a lower bound
(``ruff==0.17.*``) are already pinned and print nothing. Dependencies that are not declared
(the libraries the requirements pull in) stay free, as for a user who installs them.

Standard library only: it runs before the virtualenv exists.
"""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# name, optional [extras], version specifiers, optional `; marker` (PEP 508 without URLs)
_REQUIREMENT = re.compile(
    r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*"
    r"(?P<specs>[^;]*?)\s*(?:;\s*(?P<marker>.+?))?\s*$")


def requirements(pyproject: Path, extras: list[str]) -> list[str]:
    """The requirement strings of ``[project] dependencies`` and of the named extras."""
    project = tomllib.loads(pyproject.read_text())["project"]
    groups = project.get("optional-dependencies", {})
    unknown = sorted(set(extras) - set(groups))
    if unknown:
        raise ValueError(f"no optional-dependencies group {unknown} in {pyproject}")
    lines = list(project["dependencies"])
    for extra in extras:
        lines += groups[extra]
    return lines


def lower_bound_pin(requirement: str) -> str | None:
    """``'numpy>=1.26'`` -> ``'numpy==1.26'``, the marker kept; None without a ``>=`` bound."""
    match = _REQUIREMENT.match(requirement)
    if match is None:
        raise ValueError(f"cannot read the requirement {requirement!r}")
    bounds = [spec.strip()[2:].strip() for spec in match["specs"].split(",")
              if spec.strip().startswith(">=")]
    if not bounds:
        return None
    if len(bounds) > 1:
        raise ValueError(f"{requirement!r} has more than one lower bound")
    pin = f"{match['name']}=={bounds[0]}"
    return f"{pin}; {match['marker']}" if match["marker"] else pin


def oldest_constraints(pyproject: Path, extras: list[str]) -> list[str]:
    """One ``name==lower-bound[; marker]`` line per requirement that has a lower bound."""
    pins = (lower_bound_pin(r) for r in requirements(pyproject, extras))
    return [pin for pin in pins if pin is not None]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("extras", nargs="*", help="optional-dependency groups to include")
    parser.add_argument("--pyproject", type=Path, default=ROOT / "pyproject.toml")
    args = parser.parse_args(argv)
    print("\n".join(oldest_constraints(args.pyproject, args.extras)))


if __name__ == "__main__":
    main()
