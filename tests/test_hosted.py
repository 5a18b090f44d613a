"""The hosted-notebook setup cell (course_lib.authoring.hosted): written into every lesson, a
no-op where the course is installed, and, on a runtime that has only the notebook, a working
install from one address.

The end-to-end test (``test_a_lesson_alone_in_an_empty_folder_sets_itself_up``) is slow and
needs the package index; it runs only when asked:

    COURSE_HOSTED_TEST=1 .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_hosted.py

It builds what a hosted runtime has before the course arrives (a fresh venv with a CPU torch and
ipykernel preinstalled, and nothing else), copies lesson 00 alone into an empty folder, points
COURSE_SOURCE at a git repository made from this checkout's files (tagged, standing for the
published address) and runs the notebook there with nbclient. What it measured goes to
``tests/output/hosted_check.json``; ``results/hosted_check.json`` records the committed run.
"""
import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from course_lib.authoring import hosted, nbmeta

ROOT = Path(__file__).resolve().parent.parent
LESSONS = [p for p, _ in hosted.lessons(ROOT)]


def _src(cell):
    return "".join(cell["source"])


def test_committed_lessons_have_the_current_setup_cell():
    stale = hosted.stale(ROOT)
    assert not stale, f"run `python -m course_lib.authoring.hosted` and commit: {stale}"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_lesson_opens_with_the_setup_cell_off_the_slides(path):
    cells = json.loads(path.read_text())["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    assert hosted.is_setup_cell(code[0]), "the setup cell must be the first code cell"
    assert _src(code[0]) == hosted.cell_source()
    assert code[0]["metadata"]["slideshow"] == {"slide_type": "skip"}
    assert cells[0]["cell_type"] == "markdown" and cells[0]["metadata"]["slideshow"]["slide_type"] == "slide"
    # the device summary after it is still skipped: the setup cell is not "the first code cell"
    assert code[1]["metadata"]["slideshow"] == {"slide_type": "skip"}, _src(code[1])
    assert not any("%pip" in _src(c) or "HOSTED = " in _src(c) for c in code)


def test_nbmeta_skips_the_tag_hosted_writes():
    assert nbmeta.SETUP_TAG == hosted.TAG
    nb = {"cells": [
        {"cell_type": "markdown", "id": "t", "metadata": {}, "source": ["# 99 · Toy"]},
        {"cell_type": "code", "id": "s", "metadata": {}, "source": ["print(1)"],
         "outputs": [], "execution_count": None},
    ], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    with_cell = hosted.with_setup_cell(nb)
    assert [c["id"] for c in with_cell["cells"]] == ["t", hosted.CELL_ID, "s"]
    stamped = nbmeta.stamp(with_cell, grading=False)
    assert [c["metadata"]["slideshow"]["slide_type"] for c in stamped["cells"]] == ["slide", "skip", "-"]
    # idempotent, and a stale cell's text is replaced in place (not duplicated)
    assert hosted.with_setup_cell(with_cell) == with_cell
    with_cell["cells"][1]["source"] = ["old text"]
    again = hosted.with_setup_cell(with_cell, source="https://example.org/c.git@v1")
    assert [c["id"] for c in again["cells"]] == ["t", hosted.CELL_ID, "s"]
    assert '"https://example.org/c.git@v1"' in _src(again["cells"][1])


def test_the_cell_is_a_fast_no_op_where_the_course_is_installed():
    code = compile(hosted.cell_source(), "setup-cell", "exec")
    best = float("inf")
    for _ in range(5):
        ns = {}
        start = time.perf_counter()
        exec(code, ns)
        best = min(best, time.perf_counter() - start)
    assert best < 0.05, f"{best * 1000:.1f} ms"
    assert set(ns) - {"__builtins__"} == {"importlib"}, "it must define nothing else"


def _run_cell(tmp_path, env_extra, cell=None):
    """The cell under a Python that cannot see the course (-I: no PYTHONPATH, no user site;
    -S: no site-packages), in an empty folder."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COURSE_")}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-I", "-S", "-c", cell or hosted.cell_source()],
                          cwd=work, env=env, capture_output=True, text=True, timeout=120)


def test_without_the_course_and_without_an_address_it_says_what_to_set(tmp_path):
    out = _run_cell(tmp_path, {})
    assert out.returncode == 1
    assert "COURSE_SOURCE" in out.stderr and "not installed here" in out.stderr, out.stderr
    assert not (tmp_path / "work" / "quant-course").exists()


def _fake_course(folder: Path) -> Path:
    """A stand-in course whose setup() only records that it was called (no installs)."""
    (folder / "course_lib" / "authoring").mkdir(parents=True)
    (folder / "course_lib" / "__init__.py").write_text("")
    (folder / "course_lib" / "authoring" / "__init__.py").write_text("")
    (folder / "course_lib" / "authoring" / "hosted.py").write_text(
        "import os\n"
        "def setup(home):\n"
        "    open(os.path.join(home, 'setup-called'), 'w').write(os.getcwd())\n")
    return folder


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
def test_a_release_archive_is_fetched_and_its_setup_called(tmp_path, kind):
    course = _fake_course(tmp_path / "course-v1")
    archive = shutil.make_archive(str(tmp_path / "course-v1"), "gztar" if kind == "tar.gz" else "zip",
                                  tmp_path, "course-v1")
    out = _run_cell(tmp_path, {"COURSE_SOURCE": archive})
    assert out.returncode == 0, out.stderr
    home = tmp_path / "work" / "quant-course"
    assert (home / "course_lib" / "authoring" / "hosted.py").is_file()
    assert (home / "setup-called").is_file()
    assert course.is_dir()


def test_a_git_url_at_a_tag_is_cloned_at_that_tag(tmp_path):
    repo = _fake_course(tmp_path / "repo")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "-C", str(repo), "add", "-A"], check=True)
    subprocess.run([*git, "-C", str(repo), "commit", "-q", "-m", "v1"], check=True)
    subprocess.run([*git, "-C", str(repo), "tag", "v1"], check=True)
    (repo / "after-v1").write_text("not in the release")
    subprocess.run([*git, "-C", str(repo), "add", "-A"], check=True)
    subprocess.run([*git, "-C", str(repo), "commit", "-q", "-m", "later"], check=True)
    out = _run_cell(tmp_path, {"COURSE_SOURCE": f"file://{repo}@v1",
                               "COURSE_DIR": str(tmp_path / "elsewhere")})
    assert out.returncode == 0, out.stderr
    home = tmp_path / "elsewhere"
    assert (home / "setup-called").is_file() and not (home / "after-v1").exists()


@pytest.mark.parametrize("source, want", [
    ("https://github.com/org/course.git", ("git", "https://github.com/org/course.git", "")),
    ("https://github.com/org/course.git@v1.2", ("git", "https://github.com/org/course.git", "v1.2")),
    ("git@github.com:org/course.git", ("git", "git@github.com:org/course.git", "")),
    ("git@github.com:org/course.git@v1", ("git", "git@github.com:org/course.git", "v1")),
    ("https://github.com/org/course/archive/refs/tags/v1.tar.gz",
     ("archive", "https://github.com/org/course/archive/refs/tags/v1.tar.gz", "")),
    ("/media/usb/course-v1.zip", ("archive", "/media/usb/course-v1.zip", "")),
])
def test_addresses_are_read_as_the_cell_reads_them(source, want):
    assert hosted.split_source(source) == want


def test_the_placeholder_is_refused_with_what_to_set():
    with pytest.raises(ValueError, match="COURSE_SOURCE is not set"):
        hosted.split_source(hosted.COURSE_SOURCE if hosted.COURSE_SOURCE.startswith(
            hosted.PLACEHOLDER) else hosted.PLACEHOLDER)
    with pytest.raises(ValueError, match="one of"):
        hosted.setup(ROOT, folder="elsewhere")
    with pytest.raises(FileNotFoundError, match="not the course's folder"):
        hosted.setup(ROOT / "notebooks")


def test_install_commands_hold_the_runtimes_torch():
    cmds = hosted.install_commands("2.8.0+cu126", python="python")
    assert cmds[0] == ["python", "-m", "pip", "install", "-q", "-r", "requirements-hosted.txt",
                       "-c", hosted.CONSTRAINTS]
    assert cmds[1] == ["python", "-m", "pip", "install", "-q", "--no-deps", "-e", ".",
                       "-r", "requirements-nodeps.txt"]
    assert cmds[2] == ["python", "-m", "course_lib.smollm", "convert"]
    assert "-c" not in hosted.install_commands(None, python="python")[0]


def test_the_readme_shows_what_the_cell_runs():
    readme = (ROOT / "README.md").read_text()
    for cmd in hosted.install_commands("X", python="python"):
        assert " ".join(cmd) in readme, " ".join(cmd)


# ---------------------------------------------------------------- end to end (slow, opt-in)

def _closure(names):
    from packaging.requirements import Requirement
    seen, todo = {}, list(names)
    while todo:
        dist = md.distribution(todo.pop())
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in seen:
            continue
        seen[key] = dist
        for r in dist.requires or []:
            req = Requirement(r)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def _preinstall(site: Path, names) -> list[str]:
    """Hard-link (copy across file systems) each distribution of ``names`` and its
    dependencies from this environment into ``site``: a runtime's preinstalled packages."""
    done = []
    for key, dist in sorted(_closure(names).items()):
        for f in dist.files or []:
            src = Path(dist.locate_file(f)).resolve()
            if ".." in f.parts or not src.is_file():
                continue                                  # console scripts outside site-packages
            dst = site / f
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)
        done.append(f"{key}=={dist.version}")
    return done


def _snapshot_repo(dest: Path, tag: str) -> str:
    """A git repository holding this checkout's files as they are now (tracked and new files
    git does not ignore), one commit, tagged: the published course's stand-in."""
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z"],
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(dest)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "snapshot"], check=True)
    subprocess.run([*git, "tag", tag], check=True)
    return f"file://{dest}@{tag}"


@pytest.mark.skipif(os.environ.get("COURSE_HOSTED_TEST") != "1",
                    reason="slow, needs the package index: COURSE_HOSTED_TEST=1 runs it")
@pytest.mark.timeout(1800)
def test_a_lesson_alone_in_an_empty_folder_sets_itself_up(tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    record = {"lesson": "notebooks/00_the_bill.ipynb", "python": sys.version.split()[0]}
    t0 = time.perf_counter()
    venv = tmp_path / "runtime"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    record["preinstalled"] = _preinstall(site, ["torch", "ipykernel"])
    record["venv_seconds"] = round(time.perf_counter() - t0, 1)
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("COURSE_", "PYTHON", "VIRTUAL_ENV"))}
    probe = subprocess.run([str(py), "-c", "import importlib.util as u, torch; "
                            "print(torch.__version__, u.find_spec('course_lib') is None, "
                            "u.find_spec('triton') is None)"],
                           cwd=tmp_path, env=clean, capture_output=True, text=True,
                           check=True).stdout.split()
    assert probe[1:] == ["True", "True"], probe       # no course, no Triton: only what was put there
    record["runtime_torch"] = probe[0]

    source = _snapshot_repo(tmp_path / "published", "v-test")
    work = tmp_path / "content"                        # the notebook alone in its working folder
    work.mkdir()
    shutil.copy(ROOT / record["lesson"], work / "00_the_bill.ipynb")

    kernels = tmp_path / "jupyter" / "kernels" / "hosted"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [str(py), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "hosted runtime", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    env = dict(clean)
    env.update(COURSE_SOURCE=source, COURSE_CHECKS="solutions", MPLBACKEND="Agg",
               COURSE_PROGRESS_FILE=str(tmp_path / "progress.json"),
               PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}")
    nb = nbformat.read(work / "00_the_bill.ipynb", as_version=4)
    t1 = time.perf_counter()
    NotebookClient(nb, timeout=1200, kernel_name="hosted",
                   resources={"metadata": {"path": str(work)}}).execute(env=env)
    record["notebook_seconds"] = round(time.perf_counter() - t1, 1)

    setup_out = "".join(o.get("text", "") for o in nb.cells[[c.get("id") for c in nb.cells].index(
        hosted.CELL_ID)].outputs)
    assert f"keeping this runtime's torch {record['runtime_torch']}" in setup_out, setup_out
    home = work / "quant-course"
    assert (home / "course_lib" / "authoring" / "hosted.py").is_file()
    assert any((home / "models").glob("smollm2*/weights.safetensors"))
    after = subprocess.run([str(py), "-c", "import torch, course_lib, transformers; "
                            "print(torch.__version__, course_lib.__file__)"],
                           cwd=tmp_path, env=clean, capture_output=True, text=True,
                           check=True).stdout.split()
    assert after[0] == record["runtime_torch"], "the runtime's torch must be kept"
    assert Path(after[1]).resolve().is_relative_to(home.resolve())
    record["cells"] = sum(c.cell_type == "code" for c in nb.cells)
    record["errors"] = sum(o.get("output_type") == "error" for c in nb.cells
                           if c.cell_type == "code" for o in c.outputs)
    assert record["errors"] == 0
    record["total_seconds"] = round(time.perf_counter() - t0, 1)
    from course_lib import device
    record["machine"] = device.machine_record()
    out = ROOT / "tests" / "output"
    out.mkdir(parents=True, exist_ok=True)
    (out / "hosted_check.json").write_text(json.dumps(record, indent=1) + "\n")
