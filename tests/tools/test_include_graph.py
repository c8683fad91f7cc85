"""scripts/check_include_graph.py: clean on the real src/, and failing on a planted CUDA include
(direct, through another header, CudaBackend named in code) in a layer above the backend."""
import os
import shutil
import subprocess
import sys

import pytest

SRC = os.environ.get("MOESERVE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(SRC, "scripts", "check_include_graph.py")


def check(src):
    return subprocess.run([sys.executable, SCRIPT, "--src", str(src)], capture_output=True, text=True)


def test_repository_is_clean():
    r = check(os.path.join(SRC, "src"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "none reaches a CUDA header" in r.stdout


@pytest.fixture
def tree(tmp_path):
    # A copy of the real runtime/, engine/, cli/parallel_cli.* and the headers they include is
    # enough: copy src/ whole (small text files).
    dst = tmp_path / "src"
    shutil.copytree(os.path.join(SRC, "src"), dst)
    return dst


def plant(path, text):
    with open(path, "a") as f:
        f.write(text)


@pytest.mark.parametrize("where,text,expect", [
    ("runtime/graph_runner.cpp", '\n#include "backend/cuda/cuda_backend.h"\n', 'backend/cuda/cuda_backend.h'),
    ("model/layers/decoder.cpp", "\n#include <cuda_runtime.h>\n", "<cuda_runtime.h>"),
    ("engine/engine.cpp", "\n#include <cuda_runtime_api.h>\n", "<cuda_runtime_api.h>"),
    ("server/server.cpp", "\nstatic moeserve::CudaBackend* g = nullptr;\n", "names CudaBackend"),
    ("cli/parallel_cli.cpp", '\n#include "dist/nccl_communicator.h"\n', "dist/nccl_communicator.h"),
])
def test_planted_violation_fails(tree, where, text, expect):
    plant(tree / where, text)
    r = check(tree)
    assert r.returncode == 1, r.stdout
    assert where in r.stdout and expect in r.stdout, r.stdout


def test_through_a_header(tree):
    # A header of model/ that includes CUDA makes every file including it fail, with the chain.
    plant(tree / "model" / "model.h", '\n#include "backend/cuda/common/kernels.h"\n')
    r = check(tree)
    assert r.returncode == 1
    assert "runtime/model_executor.cpp" in r.stdout and "includes model/model.h" in r.stdout, r.stdout


def test_comments_and_strings_are_not_code(tree):
    plant(tree / "runtime" / "graph_runner.cpp",
          '\n// CudaBackend is not named here\n/* #include <cuda_runtime.h>\n */\n'
          'static const char* kRaw = R"x(// #include "backend/cuda/x.h")x";\n')
    r = check(tree)
    assert r.returncode == 0, r.stdout + r.stderr
