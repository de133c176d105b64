"""`make setup`: which torch build it installs (scripts/torch_args.py), that the Makefile still parses
into the same install command, and that the README tells a user how to reach the venv it makes."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess

import pytest

from tests.conftest import REPO

spec = importlib.util.spec_from_file_location("torch_args", REPO / "scripts" / "torch_args.py")
torch_args = importlib.util.module_from_spec(spec)
spec.loader.exec_module(torch_args)

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
CPU_WHEEL = {"metadata": {"version": "2.13.0+cpu", "requires_dist": ["filelock", "sympy>=1.13.3"]}}
CUDA_WHEEL = {"metadata": {"version": "2.13.0", "requires_dist": ["filelock", "nvidia-cublas-cu12==12.8.4.1; "
                                                                  "platform_system == \"Linux\""]}}


def resolver(default, cpu_index):
    asked = []

    def resolve(args):
        asked.append(args)
        return cpu_index if "--index-url" in args else default

    return resolve, asked


def test_a_cuda_build_on_a_machine_without_a_driver_is_swapped_for_the_cpu_index_build():
    resolve, asked = resolver(CUDA_WHEEL, CPU_WHEEL)
    args, warning = torch_args.choose("torch==2.13.0", CPU_INDEX, has_gpu=False, resolve=resolve)
    assert args == ["--index-url", CPU_INDEX, "torch==2.13.0"] and warning is None
    assert asked == [["torch==2.13.0"], ["--index-url", CPU_INDEX, "torch==2.13.0"]]


def test_a_cpu_build_the_indexes_already_serve_is_installed_as_before():
    """CI and the development machine: a local CPU wheel; the command is the one set-up always ran."""
    resolve, asked = resolver(CPU_WHEEL, None)
    assert torch_args.choose("torch==2.13.0", CPU_INDEX, has_gpu=False, resolve=resolve) == (["torch==2.13.0"], None)
    assert asked == [["torch==2.13.0"]]  # the CPU index is never asked


@pytest.mark.parametrize("has_gpu, cpu_index", [(True, CPU_INDEX), (False, "")])
def test_a_gpu_machine_or_no_cpu_index_keeps_the_default_index_without_asking(has_gpu, cpu_index):
    resolve, asked = resolver(CUDA_WHEEL, CPU_WHEEL)
    assert torch_args.choose("torch==2.13.0", cpu_index, has_gpu, resolve) == (["torch==2.13.0"], None)
    assert asked == []


@pytest.mark.parametrize("cpu", [None, CUDA_WHEEL], ids=["unreachable", "cuda-only"])
def test_without_a_cpu_build_to_take_it_installs_the_default_and_says_so(cpu):
    resolve, _ = resolver(CUDA_WHEEL, cpu)
    args, warning = torch_args.choose("torch==2.13.0", CPU_INDEX, has_gpu=False, resolve=resolve)
    assert args == ["torch==2.13.0"] and "CUDA build" in warning and "TORCH_INDEX" in warning


def test_cuda_builds_are_told_by_their_version_or_nvidia_requirements():
    assert torch_args.is_cuda_build(CUDA_WHEEL) and not torch_args.is_cuda_build(CPU_WHEEL)
    assert torch_args.is_cuda_build({"metadata": {"version": "2.11.0+cu128", "requires_dist": []}})


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_the_makefile_parses_and_installs_torch_through_the_choice_or_the_given_index():
    def dry(*args):
        p = subprocess.run(["make", "-n", "-B", "setup", *args], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        return [ln for ln in p.stdout.splitlines() if "pip install" in ln and "torch" in ln]

    assert dry() == ['.venv/bin/python -m pip install -q $(.venv/bin/python scripts/torch_args.py "torch==2.13.0" '
                     f'"{CPU_INDEX}")']
    assert dry("TORCH_INDEX=https://example.org/whl/cu128", "TORCH_SPEC=torch==2.11.0") == [
        '.venv/bin/python -m pip install -q --index-url "https://example.org/whl/cu128" "torch==2.11.0"']


def test_the_readme_says_how_to_use_the_venv_and_names_only_the_makefiles_variables():
    readme, makefile = (REPO / "README.md").read_text(), (REPO / "Makefile").read_text()
    assert "source .venv/bin/activate" in readme and "make train ARGS=" in readme
    named = set(re.findall(r"\b(TORCH_[A-Z_]+)=", readme))
    assert {"TORCH_SPEC", "TORCH_INDEX", "TORCH_CPU_INDEX"} <= named
    assert all(re.search(rf"^{v} \?=", makefile, re.M) for v in named), named


def test_pips_dry_run_report_is_read_for_the_installed_torch_version():
    """The real pip, not a stand-in: the report names the wheel the configured indexes would give."""
    import torch

    version = torch.__version__.split("+")[0]
    item = torch_args.resolve([f"torch=={version}"])
    assert item is not None and item["metadata"]["name"] == "torch"
    assert item["metadata"]["version"].split("+")[0] == version
    assert isinstance(torch_args.is_cuda_build(item), bool)
