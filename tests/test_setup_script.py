"""scripts/setup.sh chooses the torch build and the GPU extras for the machine it runs on.

The script runs in dry-run mode (it prints the commands it would run and writes nothing) with a fake
``nvidia-smi`` on PATH, so the CUDA path is checked without a GPU and without downloading anything.
One test runs it for real against a fake environment whose ``python`` records its arguments, to check
that a flash-attn that does not build leaves a warning and a finished set-up.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.cli

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "setup.sh"
SYSTEM_PATH = "/usr/bin:/bin"
PIP = "-m pip install --quiet --disable-pip-version-check"
CUDA_INDEX = "https://download.pytorch.org/whl"
LIGER = "plugins/omnicore-kernels-liger"
FLASH_ATTN = "plugins/omnicore-kernels-flash-attn"


def plugins() -> list[str]:
    """The PLUGINS array of the script, so that adding a plugin there does not break these tests."""
    match = re.search(r"^PLUGINS=\((.*)\)$", SCRIPT.read_text(), re.MULTILINE)
    assert match, "scripts/setup.sh has no one-line PLUGINS=(...) array"
    return match.group(1).split()


def fake_nvidia_smi(bin_dir: Path, cuda: str = "13.0", capability: str = "9.0", gpus: int = 1) -> None:
    """An nvidia-smi that answers like a driver for CUDA ``cuda`` with ``gpus`` GPUs of ``capability``."""
    listing = "\n".join(f"GPU {i}: NVIDIA H200 (UUID: GPU-{i:08x}-0000)" for i in range(gpus))
    caps = "\n".join(capability for _ in range(gpus))
    write_script(
        bin_dir / "nvidia-smi",
        f"""case "$1" in
  -L) cat <<'EOF'
{listing}
EOF
  ;;
  --query-gpu=compute_cap) cat <<'EOF'
{caps}
EOF
  ;;
  *) cat <<'EOF'
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.82.07              Driver Version: 580.82.07      CUDA Version: {cuda}     |
|-----------------------------------------+------------------------+----------------------+
EOF
  ;;
esac
""",
    )


def broken_nvidia_smi(bin_dir: Path) -> None:
    """The nvidia-smi of a machine whose driver is not loaded: a message and a failure."""
    write_script(bin_dir / "nvidia-smi", 'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."\nexit 9\n')


def write_script(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def setup(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """Run the script with a clean environment: PATH is tmp_path/bin (the fakes) then the system's."""
    full_env = {
        "PATH": f"{tmp_path / 'bin'}:{SYSTEM_PATH}",
        "HOME": str(tmp_path),
        "OMNICORE_VENV": str(tmp_path / "venv"),
        **env,
    }
    return subprocess.run(["bash", str(SCRIPT), *args], env=full_env, capture_output=True, text=True, timeout=60)


def dry_run(tmp_path: Path, venv_exists: bool = False, **env: str) -> list[str]:
    """The commands a dry run prints (without the '+ '), after checking that it wrote nothing."""
    stamp = ROOT / ".venv" / ".omnicore-setup"
    before = stamp.stat().st_mtime_ns if stamp.exists() else None
    done = setup(tmp_path, "--dry-run", **env)
    assert done.returncode == 0, done.stderr
    if not venv_exists:
        assert not (tmp_path / "venv").exists(), "a dry run created the environment"
    assert (stamp.stat().st_mtime_ns if stamp.exists() else None) == before, "a dry run touched .venv"
    return [line[2:] for line in done.stdout.splitlines() if line.startswith("+ ")]


def cpu_commands(venv: Path) -> list[str]:
    """What the set-up has always run on a CPU machine: pinned torch, then everything else."""
    editable = " ".join(f"-e {p}" for p in plugins())
    return [
        f"python3 -m venv {venv}",
        f"{venv}/bin/python {PIP} torch==2.13.0",
        f"{venv}/bin/python {PIP} torch==2.13.0 -e '.[bench]' {editable} 'pytest>=8' copier==9.19.1 ruff==0.14.14 mypy==1.19.1 build==1.6.1",
    ]


def cuda_commands(venv: Path, build: str, flash_attn: bool = True) -> list[str]:
    editable = " ".join(f"-e '{p}[gpu]'" if p == LIGER else f"-e {p}" for p in plugins())
    commands = [
        f"python3 -m venv {venv}",
        f"{venv}/bin/python {PIP} torch==2.13.0 --index-url {CUDA_INDEX}/{build}",
        f"{venv}/bin/python {PIP} torch==2.13.0 -e '.[bench]' {editable} 'pytest>=8' copier==9.19.1 ruff==0.14.14 mypy==1.19.1 build==1.6.1",
    ]
    if flash_attn:
        commands += [
            f"{venv}/bin/python {PIP} packaging psutil ninja wheel 'setuptools>=68'",
            f"{venv}/bin/python {PIP} --no-build-isolation -e '{FLASH_ATTN}[gpu]'",
        ]
    return commands


def without_stamp(commands: list[str]) -> list[str]:
    assert re.fullmatch(r"echo [0-9a-f]{16} > .*/venv/\.omnicore-setup", commands[-1]), commands[-1]
    return commands[:-1]


def test_gpu_machine_gets_the_cuda_build_and_the_gpu_extras(tmp_path):
    fake_nvidia_smi(tmp_path / "bin", cuda="13.0", capability="9.0")
    done = setup(tmp_path, "--dry-run")
    assert "device cuda (OMNICORE_DEVICE=auto; 1 GPU(s), compute capability 9.0, driver for CUDA 13.0)" in done.stdout
    commands = [line[2:] for line in done.stdout.splitlines() if line.startswith("+ ")]
    assert without_stamp(commands) == cuda_commands(tmp_path / "venv", "cu130")
    assert not (tmp_path / "venv").exists()


@pytest.mark.parametrize(
    ("cuda", "capability", "build"),
    [
        ("13.0", "9.0", "cu130"),  # Hopper, current driver
        ("13.2", "12.0", "cu130"),  # Blackwell
        ("13.0", "7.5", "cu130"),  # Turing: the oldest the cu130 build has kernels for
        ("13.0", "7.0", "cu126"),  # Volta: only the cu126 build has kernels for it
        ("13.0", "6.1", "cu126"),  # Pascal
        ("12.8", "8.0", "cu126"),  # a 12.x driver cannot run cu130
        ("12.2", "8.6", "cu126"),  # minor-version compatibility within CUDA 12
    ],
)
def test_cuda_build_follows_driver_and_gpu(tmp_path, cuda, capability, build):
    fake_nvidia_smi(tmp_path / "bin", cuda=cuda, capability=capability)
    torch_line = without_stamp(dry_run(tmp_path))[1]
    assert torch_line.endswith(f"torch==2.13.0 --index-url {CUDA_INDEX}/{build}")


@pytest.mark.parametrize(
    ("cuda", "capability", "message"),
    [
        ("12.8", "12.0", "needs torch's cu130 build, but the driver runs CUDA 12.8: update the NVIDIA driver"),
        ("11.8", "8.0", "needs an NVIDIA driver for CUDA 12.0 or newer, but the driver runs CUDA 11.8"),
    ],
)
def test_a_driver_too_old_stops_with_what_to_do(tmp_path, cuda, capability, message):
    fake_nvidia_smi(tmp_path / "bin", cuda=cuda, capability=capability)
    done = setup(tmp_path, "--dry-run")
    assert done.returncode == 2
    assert message in done.stderr
    assert "+ " not in done.stdout


def test_no_gpu_runs_the_cpu_commands_as_before(tmp_path):
    broken_nvidia_smi(tmp_path / "bin")  # a driver that is not loaded lists no GPU
    assert without_stamp(dry_run(tmp_path)) == cpu_commands(tmp_path / "venv")


@pytest.mark.skipif(shutil.which("nvidia-smi", path=SYSTEM_PATH) is not None, reason="this machine has nvidia-smi in /usr/bin")
def test_no_nvidia_smi_runs_the_cpu_commands_as_before(tmp_path):
    assert without_stamp(dry_run(tmp_path)) == cpu_commands(tmp_path / "venv")


def test_device_cpu_wins_over_a_gpu(tmp_path):
    fake_nvidia_smi(tmp_path / "bin", gpus=8)
    assert without_stamp(dry_run(tmp_path, OMNICORE_DEVICE="cpu")) == cpu_commands(tmp_path / "venv")


def test_device_cuda_without_a_gpu_takes_the_stable_cuda_build(tmp_path):
    broken_nvidia_smi(tmp_path / "bin")
    commands = without_stamp(dry_run(tmp_path, OMNICORE_DEVICE="cuda"))
    assert commands == cuda_commands(tmp_path / "venv", "cu130")


def test_torch_index_and_flash_attn_switches(tmp_path):
    fake_nvidia_smi(tmp_path / "bin", cuda="13.2", capability="10.0")
    index = "https://download.pytorch.org/whl/cu132"
    commands = without_stamp(dry_run(tmp_path, OMNICORE_TORCH_INDEX=index, OMNICORE_FLASH_ATTN="0"))
    expected = cuda_commands(tmp_path / "venv", "cu132", flash_attn=False)
    assert commands == expected
    assert f"--index-url {index}" in commands[1]


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        ((), {"OMNICORE_DEVICE": "gpu"}, "OMNICORE_DEVICE must be auto, cpu or cuda, not 'gpu'"),
        (("--dryrun",), {}, "unknown argument '--dryrun'"),
    ],
)
def test_bad_input_is_one_clear_error(tmp_path, args, env, message):
    done = setup(tmp_path, *args, **env)
    assert done.returncode == 2
    assert message in done.stderr
    assert not (tmp_path / "venv").exists()


def test_switching_device_reinstalls(tmp_path):
    """The stamp covers the device: a CPU set-up is up to date for cpu, and not for cuda."""
    fake_nvidia_smi(tmp_path / "bin")
    cpu_stamp = dry_run(tmp_path, OMNICORE_DEVICE="cpu")[-1]
    cuda_stamp = dry_run(tmp_path)[-1]
    assert cpu_stamp != cuda_stamp
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".omnicore-setup").write_text(cpu_stamp.split()[1] + "\n")
    again = setup(tmp_path, "--dry-run", OMNICORE_DEVICE="cpu")
    assert "up to date" in again.stdout and "+ " not in again.stdout
    switched = dry_run(tmp_path, venv_exists=True)
    assert switched[-1] == cuda_stamp
    assert without_stamp(switched) == cuda_commands(venv, "cu130")  # no bin/python here: created again


@pytest.mark.parametrize(
    ("device", "have", "uninstalls"),
    [
        ("cuda", "2.13.0+cpu", True),  # pip would keep it: 2.13.0+cpu satisfies torch==2.13.0
        ("cuda", "2.13.0+cu126", True),  # another CUDA build than the driver's
        ("cuda", "2.13.0+cu130", False),
        ("cpu", "2.13.0+cu130", True),
        ("cpu", "2.13.0+cpu", False),
        ("cpu", "2.13.0", False),  # PyPI's own build
    ],
)
def test_another_devices_torch_is_replaced(tmp_path, device, have, uninstalls):
    fake_nvidia_smi(tmp_path / "bin", cuda="13.0")
    write_script(tmp_path / "venv" / "bin" / "python", f'case "$*" in *importlib.metadata*) echo "{have}" ;; esac\n')
    commands = dry_run(tmp_path, OMNICORE_DEVICE=device, venv_exists=True)
    venv = tmp_path / "venv"
    assert commands[0] != f"python3 -m venv {venv}"  # the environment is there already
    uninstall = f"{venv}/bin/python -m pip uninstall --quiet --yes torch"
    assert (commands[0] == uninstall) is uninstalls
    assert commands.count(uninstall) == int(uninstalls)


def fake_python(path: Path, calls: Path, flash_attn_status: int) -> None:
    """A venv python that records each call and answers the set-up's questions like a CUDA venv."""
    write_script(
        path,
        f"""printf '%s\\n' "$*" >> "{calls}"
case "$*" in
  *importlib.metadata*) echo 2.13.0+cpu ;;
  *sys.version_info*) echo 3.11 ;;
  *"import torch"*) echo "torch 2.13.0+cu130 transformers 5.24.0 CUDA 13.0 GPU available: True" ;;
  *--no-build-isolation*) echo "error: flash-attn needs nvcc" >&2; exit {flash_attn_status} ;;
esac
""",
    )


@pytest.mark.parametrize("flash_attn_status", [0, 1])
def test_flash_attn_failure_is_a_warning(tmp_path, flash_attn_status):
    fake_nvidia_smi(tmp_path / "bin", cuda="13.0")
    venv, calls = tmp_path / "venv", tmp_path / "calls.txt"
    fake_python(venv / "bin" / "python", calls, flash_attn_status)
    done = setup(tmp_path)
    assert done.returncode == 0, done.stderr
    recorded = calls.read_text().splitlines()
    pip_calls = [c.split() for c in recorded if c.startswith("-m pip")]  # no argument holds a space
    expected = [shlex.split(c)[1:] for c in cuda_commands(venv, "cu130")[1:]]  # what a dry run prints
    assert pip_calls == ["-m pip uninstall --quiet --yes torch".split(), *expected]  # the +cpu torch went first
    assert re.fullmatch(r"[0-9a-f]{16}\n", (venv / ".omnicore-setup").read_text())
    assert "environment ready" in done.stdout and "torch 2.13.0+cu130" in done.stdout
    log = (venv / "flash-attn-install.log").read_text()
    assert "flash-attn needs nvcc" in log
    if flash_attn_status:
        assert "warning: flash-attn did not install (pip exit status 1" in done.stderr
        assert "built for torch 2.13, cu130 and Python 3.11" in done.stderr
        assert "flash-attn installed" not in done.stdout
    else:
        assert "warning" not in done.stderr
        assert "flash-attn installed" in done.stdout
