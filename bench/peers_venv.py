"""The peers' virtualenv, ``bench/.peers-venv``: built once with pinned Stable-Baselines3 and
torch, reused while its requirements and Python stay the same (`bench.peers` says why it is
separate from ``.venv``). Standard library only: the peers venv's interpreter imports it too.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
VENV = HERE / ".peers-venv"
STAMP = ".built.json"  # in the venv: the requirements' hash, the build's seconds and date
# torch 2.13.0 is the CPU build that lies on this project's machines (2.14.1 there is a CUDA
# build of several GB); the pins keep the peer's figures comparable from run to run.
REQUIREMENTS = ("stable-baselines3==2.9.2", "torch==2.13.0")
# Installed into the built venv on first need (not in `REQUIREMENTS`, whose change would
# rebuild torch): the MuJoCo envs, pinned to the version the project's own tests use.
EXTRAS = {"mujoco": ("mujoco==4.0.1", "imageio>=2.14.1", "packaging>=23")}


def requirements_hash(requirements: tuple[str, ...] | list[str],
                      python_version: str | None = None) -> str:
    """sha256 of the requirements (order and surrounding blanks ignored) and the Python
    version: the venv is rebuilt when it changes."""
    lines = sorted(r.strip() for r in requirements if r.strip())
    text = f"python {python_version or platform.python_version()}\n" + "\n".join(lines)
    return hashlib.sha256(text.encode()).hexdigest()


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def venv_is_current(venv: Path, requirements: tuple[str, ...] | list[str] = REQUIREMENTS,
                    python_version: str | None = None) -> bool:
    """True if ``venv`` was built (to the end) for these requirements and Python version."""
    try:
        stamp = json.loads((venv / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return (stamp.get("requirements_sha256") == requirements_hash(requirements, python_version)
            and venv_python(venv).exists())


def dir_size_mb(path: Path) -> float:
    """Bytes of the regular files under ``path`` (links not followed), in MB (1e6)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if not os.path.islink(os.path.join(root, name)):
                total += st.st_size
    return round(total / 1e6, 1)


def ensure_venv(venv: Path = VENV, requirements: tuple[str, ...] = REQUIREMENTS,
                rebuild: bool = False, log: Any = print) -> dict[str, Any]:
    """The peers venv, built if missing, stale or ``rebuild``; its path, size and build."""
    digest = requirements_hash(requirements)
    reused = not rebuild and venv_is_current(venv, requirements)
    if not reused:
        if venv.exists():
            log(f"bench.peers: removing {venv} (built for other requirements, or unfinished)")
            shutil.rmtree(venv)
        log(f"bench.peers: building {venv} with {' '.join(requirements)} from PyPI "
            "(torch is large: the first build takes minutes)", flush=True)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv_python(venv)), "-m", "pip", "install", "--progress-bar", "off",
                        "--disable-pip-version-check", "--quiet", *requirements], check=True)
        stamp = {"requirements": list(requirements), "requirements_sha256": digest,
                 "python": platform.python_version(),
                 "built_s": round(time.perf_counter() - t0, 1),
                 "built_at": time.strftime("%Y-%m-%d %H:%M:%S")}
        (venv / STAMP).write_text(json.dumps(stamp, indent=2))  # last: marks the build done
    stamp = json.loads((venv / STAMP).read_text())
    info = {"path": str(venv), "reused": reused, "requirements": list(requirements),
            "requirements_sha256": digest, "built_s": stamp.get("built_s"),
            "built_at": stamp.get("built_at"), "size_mb": dir_size_mb(venv)}
    log(f"bench.peers: venv {venv} ({'reused' if reused else 'built'}; built in "
        f"{info['built_s']} s on {info['built_at']}; {info['size_mb']:,.0f} MB)", flush=True)
    return info


def ensure_extra(venv: Path, name: str, log: Any = print) -> list[str]:
    """Installs `EXTRAS` ``name`` into the (built) venv unless its stamp lists it already;
    the extra's requirements."""
    requirements = list(EXTRAS[name])
    stamp_file = venv / STAMP
    stamp = json.loads(stamp_file.read_text())
    if stamp.get("extras", {}).get(name) != requirements:
        log(f"bench.peers: installing the {name} extra into {venv}: {' '.join(requirements)}",
            flush=True)
        subprocess.run([str(venv_python(venv)), "-m", "pip", "install", "--progress-bar", "off",
                        "--disable-pip-version-check", "--quiet", *requirements], check=True)
        stamp.setdefault("extras", {})[name] = requirements
        stamp_file.write_text(json.dumps(stamp, indent=2))
    return requirements
