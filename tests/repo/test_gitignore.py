"""What the tools write into a checkout (built engines, dflash-serve's repository and server files) is ignored."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # dflash-build and dflash-serve as processes

ROOT = Path(__file__).parents[2]


def run(*args, cwd):
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, check=True).stdout


def test_tool_outputs_leave_the_checkout_clean(builtin, tmp_path):
    checkout = tmp_path / "checkout"
    for rel in (".gitignore", "engines/README.md", "triton_repo/README.md"):
        (checkout / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, checkout / rel)
    run("git", "init", "-q", cwd=checkout)
    run("git", "add", "-A", cwd=checkout)
    status = run("git", "status", "--porcelain", "--untracked-files=all", cwd=checkout)  # the three files, staged
    run(sys.executable, "-m", "trtllm_dflash.cli.build", "--target", str(builtin[0]), "--drafter", str(builtin[1]),
        "--output", "engines/tiny", "--max-seq-len", "128", cwd=checkout)
    run(sys.executable, "-m", "trtllm_dflash.cli.serve", "engines/tiny", "--write-only", cwd=checkout)
    run(sys.executable, "-c", "from pathlib import Path; from trtllm_dflash.serve.locate import find_tritonserver; "
        "find_tritonserver(Path('triton_repo').absolute().parent / '.dflash-triton')", cwd=checkout)  # as dflash-serve
    assert (checkout / "engines/tiny/manifest.json").is_file() and (checkout / "triton_repo/dflash").is_dir()
    assert (checkout / ".dflash-triton").is_dir()
    assert run("git", "status", "--porcelain", "--untracked-files=all", cwd=checkout) == status  # nothing new
