"""The pre-workshop check: is this machine ready for the course? (``python -m course_lib.preflight``)

Not taught in a lesson; run before the day (docs/server.md, docs/instructors.md), as the
Carpentries' installation tests are. One line per check, PASS / WARN / FAIL, then the machine's
details, in well under two minutes (SmolLM2's load and one short forward are the slow part,
a few seconds):

- Python 3.11 or newer; the setup stamp (``make setup``'s ``.venv/.installed``, or the
  ``.course-install.json`` that ``tools/install_course.sh`` writes into the environment);
- the course's packages at the versions requirements.txt pins;
- torch: its version and build (CPU-only, CUDA, Apple's MPS) and the GPU it sees;
- SmolLM2-135M converted, loaded, and greedy on "The capital of France is" -> " Paris";
- Triton, or its absence (lessons 09-11 then show their kernels without launching them);
- llama.cpp's engine (llama-cpp-python), or its absence (lessons 13-14 skip their engine cells);
- free memory against the heaviest lesson's measured peak (``results/lesson_memory.json``);
- free disk.

The exit code is 1 when a check FAILs (something that blocks the day: no SmolLM2, too old a
Python or torch, a core package missing, too little memory for lesson 04 or too little disk),
else 0; a WARN leaves part of the course without something and says which part.
``--json`` prints the same as one JSON object, for an instructor collecting the room's reports.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from course_lib import device, smollm
from course_lib.paths import ROOT

MIN_PYTHON = (3, 11)
GIB = 2**30
#: results/lesson_memory.json: peak memory of the heaviest lessons, measured (docs/server.md).
MEMORY_FILE = ROOT / "results" / "lesson_memory.json"
#: The lesson whose peak a machine must hold: the first to load SmolLM2 (lessons 05-16 build on it).
BLOCKING_LESSON = "04_a_real_model"
#: Free disk below this FAILs (the course writes little while it runs: progress, a converted
#: model is already there); below DISK_WARN_GIB it WARNs (make book, render, exports need more).
DISK_FAIL_GIB = 0.5
DISK_WARN_GIB = 2.0
#: Packages without which no lesson runs: missing ones FAIL. The rest of requirements.txt WARNs.
CORE = ("torch", "numpy", "matplotlib", "ipywidgets", "ml_dtypes", "pyyaml", "safetensors",
        "tokenizers", "gguf", "transformers", "accelerate", "compressed-tensors")
#: Needed only by the tests or by one tool: their absence is an INFO line, not a warning.
OPTIONAL = ("playwright", "nbgrader", "pytest", "pytest-timeout", "nbval")

PASS, WARN, FAIL, INFO = "PASS", "WARN", "FAIL", "INFO"


@dataclass
class Check:
    """One line of the report: what was checked, its status, and what it means."""
    name: str
    status: str
    detail: str
    data: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------- probes
# Each probe reads one fact of this machine; the checks below judge it. Tests replace probes.

def probe_python() -> tuple[tuple[int, int, int], str]:
    return tuple(sys.version_info[:3]), sys.executable


def probe_stamps() -> dict:
    """Which setup stamps exist: make setup's (.venv/.installed) and install_course.sh's."""
    prefix = Path(sys.prefix)
    found = {}
    make_stamp = prefix / ".installed"
    if make_stamp.exists():
        found["make setup"] = str(make_stamp)
    script_stamp = prefix / ".course-install.json"
    if script_stamp.exists():
        try:
            found["tools/install_course.sh"] = json.loads(script_stamp.read_text())
        except (OSError, ValueError):
            found["tools/install_course.sh"] = {"unreadable": str(script_stamp)}
    return found


def _pins() -> dict[str, str]:
    """requirements.txt's pins (name -> version), lower-case names; unpinned lines give ''."""
    pins = {}
    req = ROOT / "requirements.txt"
    if not req.exists():
        return pins
    for line in req.read_text().splitlines():
        line = line.split("#", 1)[0].split(";", 1)[0].strip()
        if not line:
            continue
        m = re.match(r"([A-Za-z0-9_.-]+)\s*(==\s*([^\s,]+))?", line)
        if m:
            pins[m.group(1).lower().replace("_", "-")] = m.group(3) or ""
    return pins


def probe_packages() -> dict[str, str | None]:
    """Installed version of every package requirements.txt names (None when missing)."""
    from importlib import metadata

    out = {}
    for name in _pins():
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def probe_torch() -> dict:
    import torch

    info = {"version": torch.__version__, "cuda_build": torch.version.cuda,
            "cuda_available": bool(torch.cuda.is_available()), "mps": device.mps_available(),
            "threads": torch.get_num_threads(), "gpu": None}
    if info["cuda_available"]:
        p = torch.cuda.get_device_properties(0)
        info["gpu"] = f"{p.name} ({p.total_memory / GIB:.0f} GiB, compute capability {p.major}.{p.minor})"
    return info


def probe_smollm() -> dict:
    """SmolLM2: converted? loadable? greedy next token after a fixed prompt, and the time taken."""
    import torch

    t0 = time.perf_counter()
    out = {"folder": str(smollm.model_dir()),
           "converted": (smollm.model_dir() / "weights.safetensors").exists()}
    if not out["converted"]:
        return out
    try:
        model = smollm.load()
        tok = smollm.tokenizer()
        ids = torch.tensor([tok.encode("The capital of France is")])
        with torch.no_grad():
            logits = model(ids)
        out["next_token"] = tok.decode([int(logits[0, -1].argmax())])
        out["parameters"] = sum(p.numel() for p in model.parameters())
    except Exception as e:  # noqa: BLE001 - any failure to load is what this check reports
        out["error"] = f"{type(e).__name__}: {e}"
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def probe_triton() -> dict:
    ok, why = device.triton_status()
    out = {"installed": ok, "why": why}
    if ok:
        from importlib import metadata
        try:
            out["version"] = metadata.version("triton")
        except metadata.PackageNotFoundError:
            out["version"] = "?"
    return out


def probe_engine() -> dict:
    """llama-cpp-python: importing it loads llama.cpp's shared library, which is the check."""
    try:
        import llama_cpp
    except ImportError as e:
        return {"installed": False, "why": str(e).splitlines()[0] if str(e) else "not installed"}
    except OSError as e:  # the package is there but its library does not load
        return {"installed": False, "why": f"its library does not load: {e}"}
    return {"installed": True, "version": getattr(llama_cpp, "__version__", "?")}


def probe_memory() -> dict:
    """Total and available memory in bytes (psutil when installed, else /proc/meminfo)."""
    try:
        import psutil

        vm = psutil.virtual_memory()
        return {"total": int(vm.total), "available": int(vm.available)}
    except ImportError:
        pass
    try:
        fields = {}
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, value = line.split(":", 1)
            fields[key] = int(value.split()[0]) * 1024
        return {"total": fields["MemTotal"], "available": fields.get("MemAvailable", fields["MemFree"])}
    except (OSError, KeyError, ValueError):
        return {"total": None, "available": None}


def probe_disk() -> dict:
    where = smollm.models_dir() if smollm.models_dir().exists() else ROOT
    usage = shutil.disk_usage(where)
    return {"path": str(where), "free": usage.free, "total": usage.total}


def probe_lesson_memory() -> dict:
    """The measured peaks: {lesson: peak bytes} from results/lesson_memory.json ({} if absent)."""
    try:
        data = json.loads(MEMORY_FILE.read_text())
        return {name: int(row["peak_rss_mib"] * 2**20) for name, row in data["lessons"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def probe_machine() -> dict:
    try:
        cpu = device._cpuinfo()[0]
    except Exception:  # noqa: BLE001 - a detail only
        cpu = ""
    return {"os": f"{platform.system()} {platform.release()}", "arch": platform.machine(),
            "cpu": cpu or platform.processor() or platform.machine(), "logical_cpus": os.cpu_count(),
            "progress_file": os.environ.get("COURSE_PROGRESS_FILE") or "(default: per user)",
            "course": str(ROOT)}


# ----------------------------------------------------------------------------- checks

def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GIB:.1f} GiB"


def check_python() -> Check:
    version, exe = probe_python()
    text = ".".join(map(str, version))
    if tuple(version[:2]) < MIN_PYTHON:
        return Check("python", FAIL, f"Python {text} ({exe}) is too old: the course needs 3.11 or "
                     f"newer; install it and run `PYTHON=python3.11 make lab`", {"version": text})
    return Check("python", PASS, f"Python {text} ({exe})", {"version": text})


def check_setup() -> Check:
    stamps = probe_stamps()
    if stamps:
        return Check("setup", PASS, "installed by " + " and ".join(stamps), {"stamps": stamps})
    return Check("setup", WARN, f"no setup stamp in {sys.prefix}: installed some other way (conda, "
                 f"by hand)? The package check below says what is there", {"stamps": {}})


def check_packages() -> Check:
    pins, have = _pins(), probe_packages()
    missing_core = [n for n in CORE if n in have and have[n] is None]
    missing_other = [n for n, v in have.items() if v is None and n not in CORE
                     and n not in OPTIONAL and n != "triton"]
    wrong = [f"{n} {v} (pinned {pins[n]})" for n, v in have.items()
             if v is not None and pins.get(n) and v.split("+")[0] != pins[n]]
    data = {"missing": missing_core + missing_other, "other_versions": wrong}
    if missing_core:
        return Check("packages", FAIL, f"missing: {', '.join(missing_core)}: run `make setup` "
                     f"(or tools/install_course.sh) again", data)
    if missing_other or wrong:
        parts = ([f"missing: {', '.join(missing_other)}"] if missing_other else []) + \
                ([f"not the tested version: {'; '.join(wrong)}"] if wrong else [])
        return Check("packages", WARN, "; ".join(parts), data)
    absent = [n for n in OPTIONAL if have.get(n, "") is None]
    note = f" (not installed, used by tests only: {', '.join(absent)})" if absent else ""
    return Check("packages", PASS, f"{sum(v is not None for v in have.values())} packages at the "
                 f"pinned versions{note}", data)


def check_torch() -> Check:
    try:
        info = probe_torch()
    except ImportError as e:
        return Check("torch", FAIL, f"torch does not import ({e}): run `make setup` again", {})
    floor_ok = device.torch_version_tuple(info["version"]) >= device.TORCH_FLOOR
    build = (f"CUDA {info['cuda_build']} build" if info["cuda_build"] else "CPU-only build")
    if info["gpu"]:
        where = f"GPU: {info['gpu']}"
    elif info["mps"]:
        where = "Apple GPU (MPS) available"
    else:
        where = "no GPU: CPU, which is what the course is built for"
    detail = f"torch {info['version']}, {build}, {where}, {info['threads']} threads"
    if not floor_ok:
        return Check("torch", FAIL, f"{detail}: older than {'.'.join(map(str, device.TORCH_FLOOR))}, "
                     f"which the course's code needs", info)
    if info["cuda_build"] and not info["cuda_available"]:
        return Check("torch", WARN, f"{detail}; its CUDA libraries (about 3 GB) are unused here: "
                     f"a CPU-only torch is enough (docs/server.md)", info)
    return Check("torch", PASS, detail, info)


def check_smollm() -> Check:
    info = probe_smollm()
    if not info["converted"]:
        return Check("smollm2", FAIL, f"SmolLM2 is not converted in {info['folder']}: run "
                     f"`python -m course_lib.smollm convert` (lessons 04-16 need it)", info)
    if "error" in info:
        return Check("smollm2", FAIL, f"SmolLM2 does not load ({info['error']}): run "
                     f"`python -m course_lib.smollm convert --force`", info)
    said = info["next_token"]
    if said.strip() != "Paris":
        return Check("smollm2", WARN, f"SmolLM2 loads, but \"The capital of France is\" gave "
                     f"{said!r}, not ' Paris' (as lesson 04 expects): convert again with --force",
                     info)
    return Check("smollm2", PASS, f"SmolLM2-135M loads ({info['parameters'] / 1e6:.1f}M parameters, "
                 f"{info['seconds']} s) and says \"The capital of France is{said}\"", info)


def check_triton() -> Check:
    info = probe_triton()
    if info["installed"]:
        return Check("triton", PASS, f"Triton {info['version']}: lessons 09-11 launch their kernels "
                     f"(in its interpreter on a CPU, natively on an NVIDIA GPU)", info)
    return Check("triton", WARN, f"{info['why']}; lessons 09-11 still run (the kernels' source, "
                 f"plain-torch references, committed compile reports)", info)


def check_engine() -> Check:
    info = probe_engine()
    if info["installed"]:
        return Check("engine", PASS, f"llama.cpp engine (llama-cpp-python {info['version']}): "
                     f"lessons 13-14 run it", info)
    return Check("engine", WARN, f"llama.cpp engine not available ({info['why']}): lessons 13-14 "
                 f"skip their engine cells with one line each; `make engine` builds it (a C/C++ "
                 f"compiler and CMake, ~5 minutes), or install its wheel from ENGINE_WHEELS "
                 f"(docs/server.md)", info)


def check_memory() -> Check:
    """FAIL when the machine has less memory than lesson 04 (the first to load SmolLM2, which
    lessons 05-16 build on) peaked at; WARN when it, or what is free now, is below the heaviest
    lesson's peak."""
    mem, peaks = probe_memory(), probe_lesson_memory()
    data = {"total": mem["total"], "available": mem["available"], "peaks": peaks}
    if mem["total"] is None:
        return Check("memory", WARN, "could not read this machine's memory", data)
    if not peaks:
        return Check("memory", WARN, f"{_gib(mem['available'])} free of {_gib(mem['total'])}; no "
                     f"measured lesson peak to compare with ({MEMORY_FILE.name} missing)", data)
    heaviest = max(peaks, key=peaks.get)
    core = BLOCKING_LESSON if BLOCKING_LESSON in peaks else heaviest
    text = (f"{_gib(mem['available'])} free of {_gib(mem['total'])}; lesson {core[:2]} peaked at "
            f"{_gib(peaks[core])}")
    if heaviest != core:
        text += f", lesson {heaviest[:2]} at {_gib(peaks[heaviest])}"
    if mem["total"] < peaks[core]:
        return Check("memory", FAIL, f"{text}: this machine has less memory than lesson "
                     f"{core[:2]} needs, and lessons 05-16 build on it", data)
    short = [name[:2] for name, need in sorted(peaks.items()) if mem["total"] < need]
    if short:
        return Check("memory", WARN, f"{text}: too little memory for lesson(s) "
                     f"{', '.join(short)}", data)
    if mem["available"] is not None and mem["available"] < peaks[heaviest]:
        return Check("memory", WARN, f"{text}: close other programs (browsers, other notebooks' "
                     f"kernels) before those lessons", data)
    return Check("memory", PASS, text, data)


def check_disk() -> Check:
    info = probe_disk()
    text = f"{_gib(info['free'])} free where the models live ({info['path']})"
    if info["free"] < DISK_FAIL_GIB * GIB:
        return Check("disk", FAIL, f"{text}: free at least {DISK_FAIL_GIB} GiB", info)
    if info["free"] < DISK_WARN_GIB * GIB:
        return Check("disk", WARN, f"{text}: `make book` and the exports of lessons 06-07 and 13 "
                     f"want more ({DISK_WARN_GIB:.0f} GiB)", info)
    return Check("disk", PASS, text, info)


CHECKS = (check_python, check_setup, check_packages, check_torch, check_smollm, check_triton,
          check_engine, check_memory, check_disk)


def run_checks() -> list[Check]:
    results = []
    for check in CHECKS:
        try:
            results.append(check())
        except Exception as e:  # noqa: BLE001 - one broken probe must not hide the others
            name = check.__name__.removeprefix("check_")
            results.append(Check(name, FAIL, f"the check itself failed: {type(e).__name__}: {e}"))
    return results


def report(results: list[Check], machine: dict, seconds: float) -> tuple[str, int]:
    """The printed report and the exit code (1 when any check FAILs)."""
    failed = [c for c in results if c.status == FAIL]
    warned = [c for c in results if c.status == WARN]
    lines = ["Quantization, Hands On: pre-workshop check (python -m course_lib.preflight)"]
    lines += [f"{c.status:4}  {c.name:9} {c.detail}" for c in results]
    lines.append(f"machine: {machine['os']} {machine['arch']}, {machine['cpu']}, "
                 f"{machine['logical_cpus']} logical CPUs; course in {machine['course']}; "
                 f"progress file {machine['progress_file']}")
    if failed:
        lines.append(f"NOT READY: {len(failed)} check(s) failed ({', '.join(c.name for c in failed)}); "
                     f"fix the FAIL lines above ({seconds:.0f} s)")
    else:
        lines.append(f"READY: no check failed, {len(warned)} warning(s) ({seconds:.0f} s)")
    return "\n".join(lines), (1 if failed else 0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m course_lib.preflight",
                                description="Pre-workshop check: PASS/WARN/FAIL per check and the "
                                            "machine's details; exit code 1 when a check fails.")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    results = run_checks()
    machine = probe_machine()
    seconds = time.perf_counter() - t0
    text, code = report(results, machine, seconds)
    if a.json:
        print(json.dumps({"ready": code == 0, "seconds": round(seconds, 1), "machine": machine,
                          "checks": [asdict(c) for c in results]}, indent=1, default=str))
    else:
        print(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
