"""The setup command's last step, `jupyter lab`, serves the course: start it headless,
fetch /lab and lesson 00 through the contents API, stop it."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_jupyterlab_serves_the_course(tmp_path):
    port = _free_port()
    token = "course-test-token"
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"), JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"))
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ip=127.0.0.1",
           f"--port={port}", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={ROOT}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline, page = time.time() + 90, None
        while time.time() < deadline and page is None:
            try:
                with urllib.request.urlopen(f"{base}/lab?token={token}", timeout=5) as r:
                    page = r.read().decode()
            except OSError:
                assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
                time.sleep(1)
        assert page is not None, "JupyterLab did not answer on /lab within 90 s"
        assert "JupyterLab" in page or "jupyter-config-data" in page
        url = f"{base}/api/contents/notebooks/00_the_bill.ipynb?token={token}"
        with urllib.request.urlopen(url, timeout=10) as r:
            model = json.loads(r.read())
        assert model["type"] == "notebook" and model["content"]["cells"]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
