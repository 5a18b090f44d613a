"""Do the course's requirements install on each platform a learner has? Ask the package index.

    python tools/resolve_platforms.py [--uv PATH] [--out results/platform_resolution.json]

For each target in ``PLATFORMS`` (Linux x86_64 and aarch64, macOS arm64 and x86_64, Windows
x86_64; CPython 3.11) it resolves ``requirements.txt`` and ``requirements-hosted.txt`` in two
independent ways and writes what it found to ``results/platform_resolution.json``:

1. **pip, one requirement at a time, markers evaluated for the target.** ``pip install
   --dry-run --no-deps --only-binary=:all: --platform TAG --python-version 3.11`` picks the wheel
   the target would get for each requirement (and reports its metadata without downloading it);
   each dependency it declares is kept or dropped by evaluating its environment marker with
   ``packaging.markers`` against the *target's* environment (``PLATFORMS[...]["markers"]``), and
   the kept ones are looked up the same way, level by level, until nothing new appears. This is
   not ``pip install --dry-run --platform`` on the whole set: pip evaluates dependency markers
   on the machine it runs on, so torch's ``platform_system == "Linux"`` CUDA libraries would be
   demanded for Windows and macOS and fail there for no reason.
2. **uv's resolver** (``uv pip compile --python-platform ... --only-binary :all:``), when ``--uv``
   names a uv binary (install it into a separate venv: ``pip install uv``): a full resolution
   with backtracking, markers evaluated for the target.

Both ask the public index directly (pip with no configuration file and ``--isolated``, uv with
``--no-config``): the local wheel folder or constraints of the machine running the tool must not
stand in for what a learner downloads. It needs
the network, so it is not part of ``make test``; ``tests/test_environment.py`` checks the
markers themselves offline against ``PLATFORMS``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON_VERSION = "3.11"
CERT = "/etc/ssl/certs/ca-certificates.crt"

def _manylinux(arch: str, glibc_minor: int = 28) -> list[str]:
    """Every manylinux tag a glibc 2.``glibc_minor`` machine accepts, newest first: pip does not
    widen a ``--platform`` tag to the older glibc versions by itself."""
    tags = [f"manylinux_2_{m}_{arch}" for m in range(glibc_minor, 16, -1)]
    return tags + [f"manylinux2014_{arch}"] + ([f"manylinux2010_{arch}", f"manylinux1_{arch}"]
                                               if arch == "x86_64" else [])


# Each target: the wheel tags pip may pick for it, uv's name for it, and the values its
# environment markers see (PEP 508), so that a marker is judged as the target would judge it.
PLATFORMS: dict[str, dict] = {
    "linux-x86_64": {
        "pip_platforms": _manylinux("x86_64"),
        "uv_platform": "x86_64-manylinux_2_28",
        "markers": {"os_name": "posix", "sys_platform": "linux", "platform_system": "Linux",
                    "platform_machine": "x86_64"},
    },
    "linux-aarch64": {
        "pip_platforms": _manylinux("aarch64"),
        "uv_platform": "aarch64-manylinux_2_28",
        "markers": {"os_name": "posix", "sys_platform": "linux", "platform_system": "Linux",
                    "platform_machine": "aarch64"},
    },
    "macos-arm64": {
        "pip_platforms": ["macosx_14_0_arm64"],
        "uv_platform": "aarch64-apple-darwin",
        "macos_target": "14.0",
        "markers": {"os_name": "posix", "sys_platform": "darwin", "platform_system": "Darwin",
                    "platform_machine": "arm64"},
    },
    "macos-x86_64": {
        "pip_platforms": ["macosx_14_0_x86_64"],
        "uv_platform": "x86_64-apple-darwin",
        "macos_target": "14.0",
        "markers": {"os_name": "posix", "sys_platform": "darwin", "platform_system": "Darwin",
                    "platform_machine": "x86_64"},
    },
    "windows-x86_64": {
        "pip_platforms": ["win_amd64"],
        "uv_platform": "x86_64-pc-windows-msvc",
        "markers": {"os_name": "nt", "sys_platform": "win32", "platform_system": "Windows",
                    "platform_machine": "AMD64"},
    },
}

REQUIREMENT_FILES = ("requirements.txt", "requirements-hosted.txt")


def marker_environment(platform: str) -> dict[str, str]:
    """The full PEP 508 environment of a target: CPython 3.11 plus the target's own values."""
    if platform not in PLATFORMS:
        raise ValueError(f"unknown platform {platform!r}; choose one of {sorted(PLATFORMS)}")
    env = {"implementation_name": "cpython", "implementation_version": PYTHON_VERSION + ".0",
           "platform_python_implementation": "CPython", "python_version": PYTHON_VERSION,
           "python_full_version": PYTHON_VERSION + ".0", "platform_release": "",
           "platform_version": "", "extra": ""}
    env.update(PLATFORMS[platform]["markers"])
    return env


def read_requirements(path: Path) -> list[str]:
    """The requirement lines of a requirements file (comments and blank lines dropped)."""
    out = []
    for line in Path(path).read_text().splitlines():
        line = line.split(" #")[0].strip() if not line.lstrip().startswith("#") else ""
        if line and not line.startswith("-"):
            out.append(line)
    return out


def applies(requirement: str, platform: str) -> bool:
    """Does this requirement's marker (if any) select it on the target?"""
    from packaging.requirements import Requirement

    req = Requirement(requirement)
    return req.marker is None or req.marker.evaluate(marker_environment(platform))


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pip_pick(specs: list[str], platform: str, workdir: str) -> tuple[dict, dict]:
    """Ask pip which wheel each requirement would get on the target, without its dependencies.
    Returns ({name: record}, {spec: error}) ."""
    cmd = [sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--no-deps",
           "--ignore-installed", "--only-binary=:all:", "--python-version", PYTHON_VERSION,
           "--implementation", "cp", "--target", os.path.join(workdir, "target"),
           "--report", os.path.join(workdir, "report.json"), "--quiet"]
    if os.path.exists(CERT):
        cmd += ["--cert", CERT]
    for tag in PLATFORMS[platform]["pip_platforms"]:
        cmd += ["--platform", tag]
    # no pip configuration of the machine running this (its constraints or local wheel folder
    # must not stand in for what a learner's pip sees): --isolated skips only the user's
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    proc = subprocess.run(cmd + specs, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        if len(specs) == 1:
            lines = [l for l in proc.stderr.splitlines() if l.startswith("ERROR")]
            return {}, {specs[0]: " ".join(lines) or proc.stderr.strip()[-300:]}
        picked, errors = {}, {}
        for spec in specs:                        # find which ones fail, one at a time
            p, e = _pip_pick([spec], platform, workdir)
            picked.update(p)
            errors.update(e)
        return picked, errors
    report = json.loads(Path(workdir, "report.json").read_text())
    picked = {}
    for item in report["install"]:
        meta = item["metadata"]
        picked[_canonical(meta["name"])] = {
            "version": meta["version"],
            "wheel": item["download_info"]["url"].rsplit("/", 1)[-1],
            "requires_dist": meta.get("requires_dist", []),
        }
    return picked, {}


def resolve_with_pip(requirements: list[str], platform: str, max_rounds: int = 12) -> dict:
    """Walk the dependency tree with pip (--no-deps) and target-side markers.

    Each round asks pip for every package whose combined specifier (all that asked for it,
    intersected) the current pick does not satisfy, or that has no pick yet; the dependencies of
    each new pick are kept or dropped by their markers for the target (with the extras asked
    for) and join the specifiers. It stops when every pick satisfies every specifier: a simple
    resolver without backtracking across packages, enough to show a wheel exists for each."""
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    env = marker_environment(platform)
    wanted: dict[str, SpecifierSet] = {}
    extras: dict[str, set[str]] = {}
    found: dict[str, dict] = {}
    errors: dict[str, str] = {}
    skipped = [r for r in requirements if not applies(r, platform)]

    def want(req):
        name = _canonical(req.name)
        wanted[name] = wanted.get(name, SpecifierSet()) & req.specifier
        extras.setdefault(name, set()).update(req.extras)

    for r in requirements:
        if applies(r, platform):
            want(Requirement(r))
    walked: set[tuple[str, str, frozenset]] = set()
    rounds = 0
    with tempfile.TemporaryDirectory() as workdir:
        while rounds < max_rounds:
            todo = [n for n in wanted if n not in errors and
                    (n not in found or found[n]["version"] not in wanted[n])]
            for n in wanted:                  # a pick whose extras grew must be walked again
                if n in found and (n, found[n]["version"], frozenset(extras[n])) not in walked:
                    todo.append(n) if n not in todo else None
            if not todo:
                break
            rounds += 1
            fresh = [n for n in todo if n not in found or found[n]["version"] not in wanted[n]]
            if fresh:
                picked, errs = _pip_pick([f"{n}{wanted[n]}" for n in fresh], platform, workdir)
                found.update(picked)
                errors.update({_canonical(Requirement(sp).name): e for sp, e in errs.items()})
            for n in todo:
                if n not in found:
                    continue
                key = (n, found[n]["version"], frozenset(extras[n]))
                if key in walked:
                    continue
                walked.add(key)
                for dep in found[n]["requires_dist"]:
                    req = Requirement(dep)
                    if req.marker is None or any(req.marker.evaluate({**env, "extra": e})
                                                 for e in [""] + sorted(extras[n])):
                        want(req)
    conflicts = {n: {"picked": found[n]["version"], "not_within": str(wanted[n])}
                 for n in wanted if n in found and found[n]["version"] not in wanted[n]}
    top = [_canonical(Requirement(r).name) for r in requirements if applies(r, platform)]
    return {
        "ok": not errors and not conflicts,
        "packages": len(found),
        "rounds": rounds,
        "top_level": {n: found.get(n, {}).get("wheel") for n in top},
        "not_required_here": skipped,
        "errors": errors,
        "conflicts": conflicts,
        "versions": {n: found[n]["version"] for n in sorted(found)},
    }


def resolve_with_uv(uv: str, requirements_file: Path, platform: str) -> dict:
    """A full resolution by uv for the target (its resolver evaluates markers for the target)."""
    with tempfile.TemporaryDirectory() as workdir:
        out = os.path.join(workdir, "out.txt")
        env = dict(os.environ)
        if os.path.exists(CERT):
            env.setdefault("SSL_CERT_FILE", CERT)
        if "macos_target" in PLATFORMS[platform]:   # torch's macOS wheels start at macOS 14
            env["MACOSX_DEPLOYMENT_TARGET"] = PLATFORMS[platform]["macos_target"]
        cmd = [uv, "pip", "compile", "--no-config", "--python-version", PYTHON_VERSION,
               "--python-platform", PLATFORMS[platform]["uv_platform"], "--only-binary", ":all:",
               "--no-header", "--no-annotate", str(requirements_file), "-o", out]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            return {"ok": False, "error": " ".join(l.strip() for l in proc.stderr.splitlines()
                                                   if l.strip())[-600:]}
        pins = dict(l.split("==", 1) for l in Path(out).read_text().splitlines() if "==" in l)
    return {"ok": True, "packages": len(pins),
            "versions": {_canonical(k): v for k, v in sorted(pins.items())}}


def agree(entry: dict) -> bool:
    """Did the two resolutions of one target pick the same set of packages and versions?"""
    return entry["pip"]["ok"] and entry["uv"]["ok"] and \
        entry["pip"]["versions"] == entry["uv"]["versions"]


def _uv_version(uv: str) -> str:
    return subprocess.run([uv, "--version"], capture_output=True, text=True).stdout.strip()


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--uv", help="a uv binary for the second, full resolution (optional)")
    ap.add_argument("--platform", action="append", choices=sorted(PLATFORMS),
                    help="only these targets (default: all)")
    ap.add_argument("--jobs", type=int, default=5, help="targets resolved at once (default 5)")
    ap.add_argument("--out", default=str(ROOT / "results" / "platform_resolution.json"))
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from course_lib.device import machine_record

    start = time.time()
    result = {"what": "the course's requirements resolved against the public package index for "
                      "each target platform (tools/resolve_platforms.py)",
              "python_version": PYTHON_VERSION,
              "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "pip": subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True,
                                    text=True).stdout.split(" from ")[0],
              "uv": _uv_version(args.uv) if args.uv else None,
              "platforms": {}}
    jobs = [(platform, fname) for platform in args.platform or PLATFORMS
            for fname in REQUIREMENT_FILES if (ROOT / fname).exists()]

    def one(job):
        platform, fname = job
        reqs = read_requirements(ROOT / fname)
        out = {"pip": resolve_with_pip(reqs, platform)}
        if args.uv:
            out["uv"] = resolve_with_uv(args.uv, ROOT / fname, platform)
        out["ok"] = out["pip"]["ok"] and out.get("uv", {"ok": True})["ok"]
        if args.uv:
            out["pip_and_uv_agree"] = agree(out)
        print(f"{platform:15s} {fname:24s} {'installable' if out['ok'] else 'NOT installable'}"
              + ("" if out["pip"]["ok"] else
                 f"; pip: {json.dumps(out['pip']['errors'] or out['pip']['conflicts'])[:400]}")
              + ("" if out.get("uv", {"ok": True})["ok"] else f"; uv: {out['uv']['error'][-400:]}"),
              flush=True)
        return out

    # the index answers slowly one request at a time: the targets are asked side by side
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        done = dict(zip(jobs, pool.map(one, jobs)))
    for platform, fname in jobs:
        entry = result["platforms"].setdefault(
            platform, {"pip_platforms": PLATFORMS[platform]["pip_platforms"]})
        entry[fname] = done[(platform, fname)]
    result["wall_s"] = round(time.time() - start, 1)
    result["machine"] = machine_record()
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print("wrote", args.out)
    return result


if __name__ == "__main__":
    main()
