"""environment.yml (conda) and requirements.txt (pip) name the same packages and pins."""
import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CONDA_TO_PIP = {"pytorch": "torch"}
NOT_PIP = {"python", "pip"}


def _name(spec: str) -> tuple[str, str]:
    m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$", spec)
    name = m.group(1).lower().replace("_", "-")
    pin = m.group(2).replace(" ", "")
    if pin.startswith("=") and not pin.startswith("=="):
        pin = "=" + pin  # conda's single '=' means the same as pip's '=='
    return CONDA_TO_PIP.get(name, name), pin


def pip_requirements() -> dict[str, str]:
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    specs = [l.split("#")[0].strip() for l in lines]
    return dict(_name(s) for s in specs if s)


def conda_requirements() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    out = {}
    for dep in env["dependencies"]:
        for spec in (dep["pip"] if isinstance(dep, dict) else [dep]):
            name, pin = _name(spec)
            if name not in NOT_PIP:
                out[name] = pin
    return out


def test_conda_and_pip_name_the_same_packages():
    pip, conda = pip_requirements(), conda_requirements()
    assert sorted(pip) == sorted(conda), (
        f"only in requirements.txt: {sorted(set(pip) - set(conda))}; "
        f"only in environment.yml: {sorted(set(conda) - set(pip))}")
    assert pip == conda, "pins differ: " + str({k: (pip[k], conda[k]) for k in pip if pip[k] != conda[k]})


def test_torch_is_pinned_so_ci_takes_the_local_cpu_build():
    assert pip_requirements()["torch"] == "==2.13.0"


def test_pyproject_dependencies_are_all_in_requirements():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = project["dependencies"] + project["optional-dependencies"]["test"]
    pip = pip_requirements()
    for spec in deps:
        name, pin = _name(spec)
        assert name in pip, f"{name} is in pyproject.toml but not in requirements.txt"
        assert pin == pip[name], f"{name}: pyproject pins {pin!r}, requirements.txt {pip[name]!r}"
