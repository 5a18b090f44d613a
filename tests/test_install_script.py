"""tools/install_course.sh, the one install script of the images, binder/ and CI: its --help and
--dry-run, its checks (a Python older than 3.11 is refused, through a fake interpreter; bad
options are refused), the Makefile's Python check, and the files that must call the script.
Light: nothing is installed (CI runs the script for real in a clean venv: .ci/run)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "install_course.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _run(*args, env=None, cwd=ROOT, timeout=60):
    full = {**os.environ, **(env or {})}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=cwd, env=full, capture_output=True,
                          text=True, timeout=timeout)


def _fake_python(tmp_path, version="3.9"):
    """An 'interpreter' that answers every command with a version, as an old python3 would."""
    fake = tmp_path / "python3.9"
    fake.write_text(f"#!/bin/sh\necho {version}\n")
    fake.chmod(0o755)
    return fake


def test_help_lists_every_option():
    p = _run("--help")
    assert p.returncode == 0
    for option in ("PYTHON=", "COURSE_VENV=", "COURSE_TORCH=cpu", "COURSE_TORCH=index",
                   "COURSE_TORCH=keep", "COURSE_TRITON=0", "COURSE_BROWSER=1", "COURSE_ENGINE=auto",
                   "ENGINE_WHEELS=", "TORCH_WHEELS=", "TORCH_INDEX_URL", "PIP_NO_INDEX",
                   "--dry-run"):
        assert option in p.stdout, option
    assert "set -euo pipefail" not in p.stdout


def test_dry_run_prints_the_steps_and_installs_nothing(tmp_path):
    venv = tmp_path / "venv"
    p = _run("--dry-run", env={"PYTHON": sys.executable, "COURSE_VENV": str(venv)})
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert not venv.exists()
    steps = ["-m venv", "torch==2.13.0", "install -r", "--no-deps -r", "requirements-nodeps.txt",
             "--no-deps -e", "course_lib.smollm convert", "course_lib.preflight"]
    positions = [out.find(s) for s in steps]
    assert all(i >= 0 for i in positions), dict(zip(steps, positions))
    assert positions == sorted(positions), "the steps run in this order"
    if sys.platform.startswith("linux") and os.uname().machine == "x86_64":
        assert "torch==2.13.0+cpu" in out and "download.pytorch.org/whl/cpu" in out
    assert "playwright" in out and "requirements.txt less" in out  # the browser driver left out


def test_dry_run_options_change_the_plan(tmp_path):
    env = {"PYTHON": sys.executable, "COURSE_VENV": "none", "COURSE_TORCH": "index",
           "COURSE_TRITON": "0", "COURSE_ENGINE": "0", "COURSE_CHECK": "0"}
    p = _run("--dry-run", env=env)
    assert p.returncode == 0, p.stderr
    assert "-m venv" not in p.stdout and "own environment" in p.stdout
    assert "install torch==2.13.0\n" in p.stdout and "+cpu" not in p.stdout
    assert "triton" in p.stdout.split("requirements.txt less:")[1].splitlines()[0]
    assert "COURSE_ENGINE=0" in p.stdout and "course_lib.preflight" not in p.stdout


def test_engine_wheel_is_used_when_present(tmp_path):
    (tmp_path / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl").write_bytes(b"")
    p = _run("--dry-run", env={"PYTHON": sys.executable, "COURSE_VENV": str(tmp_path / "v"),
                               "ENGINE_WHEELS": str(tmp_path)})
    assert p.returncode == 0, p.stderr
    assert f"--find-links {tmp_path} -r {ROOT}/requirements-engine.txt" in p.stdout
    p = _run("--dry-run", env={"PYTHON": sys.executable, "COURSE_VENV": str(tmp_path / "v"),
                               "ENGINE_WHEELS": str(tmp_path / "none")})
    assert "no wheel in" in p.stdout and "COURSE_ENGINE=1 builds it" in p.stdout


def test_refuses_an_old_python_with_what_to_do(tmp_path):
    p = _run("--dry-run", env={"PYTHON": str(_fake_python(tmp_path)), "COURSE_VENV": str(tmp_path / "v")})
    assert p.returncode == 1
    assert "Python 3.9" in p.stderr and "3.11 or newer" in p.stderr and "PYTHON=python3.11" in p.stderr
    assert not (tmp_path / "v").exists()


def test_refuses_a_missing_python(tmp_path):
    p = _run("--dry-run", env={"PYTHON": str(tmp_path / "no-such-python")})
    assert p.returncode == 1 and "no Python interpreter" in p.stderr


@pytest.mark.parametrize("var,value", [("COURSE_TORCH", "gpu"), ("COURSE_ENGINE", "yes"),
                                       ("COURSE_TRITON", "maybe")])
def test_refuses_a_bad_option(var, value):
    p = _run("--dry-run", env={"PYTHON": sys.executable, var: value})
    assert p.returncode == 1 and var in p.stderr and value in p.stderr


def test_refuses_an_unknown_argument():
    p = _run("--install-everything")
    assert p.returncode == 2 and "--help" in p.stderr


def test_makefile_checks_python_before_creating_the_venv(tmp_path):
    """`make setup` with an old python3 and no .venv stops with what to do, creating nothing."""
    if shutil.which("make") is None:
        pytest.skip("needs make")
    for name in ("Makefile", "requirements.txt", "requirements-nodeps.txt", "pyproject.toml",
                 "requirements-engine.txt"):
        shutil.copy(ROOT / name, tmp_path / name)
    fake = _fake_python(tmp_path)
    p = subprocess.run(["make", "setup", f"PYTHON={fake}"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode != 0
    assert "needs Python 3.11 or newer" in p.stdout and "PYTHON=python3.11 make lab" in p.stdout
    assert not (tmp_path / ".venv").exists()
    ok = subprocess.run(["make", "python-check", f"PYTHON={sys.executable}"], cwd=tmp_path,
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and ": ok" in ok.stdout


def test_makefile_has_the_workshop_targets():
    text = (ROOT / "Makefile").read_text()
    for target in ("preflight:", "slides:", "image:", "image-cuda:", "python-check:"):
        assert f"\n{target}" in text, target
    assert "$(PY) -m course_lib.authoring.slides" in text
    assert "$(PY) -m course_lib.preflight" in text
    assert "docker/Dockerfile" in text and "docker/Dockerfile.cuda" in text


def test_images_binder_and_ci_run_the_script():
    for path in ("docker/Dockerfile", "docker/Dockerfile.cuda", "binder/postBuild", ".ci/run"):
        assert "tools/install_course.sh" in (ROOT / path).read_text(), path
    post = (ROOT / "binder" / "postBuild").read_text()
    assert post.startswith("#!/bin/bash") and "set -e" in post  # repo2docker ignores errors otherwise
    assert os.access(ROOT / "binder" / "postBuild", os.X_OK) and os.access(SCRIPT, os.X_OK)
    assert "python=3.11" in (ROOT / "binder" / "environment.yml").read_text()
    # with a binder/ folder repo2docker reads nothing at the root: no second requirements file here
    assert not (ROOT / "binder" / "requirements.txt").exists()
    cuda = (ROOT / "docker" / "Dockerfile.cuda").read_text()
    assert "COURSE_TORCH=index" in cuda
    assert "COURSE_TORCH=cpu" in (ROOT / "docker" / "Dockerfile").read_text()
