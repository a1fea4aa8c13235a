import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():  # Triton kernels run on the CPU through Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).parent))

from tiny_models import make_hf_target, write_drafter  # noqa: E402

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session", params=["qwen3", "llama"])
def hf_target(request, workdir):
    """(transformers model as oracle, its saved directory) for each supported architecture."""
    path = workdir / f"target-{request.param}"
    model = make_hf_target(path, request.param, seed=1)
    return model, path


@pytest.fixture(scope="session")
def random_drafter(workdir) -> Path:
    return write_drafter(workdir / "drafter-random", seed=2)


@pytest.fixture(scope="session")
def builtin_home(tmp_path_factory) -> Path:
    """A private cache for the built-in pair; subprocesses find it through TRTLLM_DFLASH_HOME."""
    home = tmp_path_factory.mktemp("home")
    os.environ["TRTLLM_DFLASH_HOME"] = str(home)
    return home


@pytest.fixture(scope="session")
def builtin(builtin_home):
    from trtllm_dflash.builtin import builtin_pair

    return builtin_pair(builtin_home)


@pytest.fixture(scope="session")
def triton_server(builtin, tmp_path_factory):
    """The real tritonserver serving a tiny torch engine of the test pair, shared by the serving tests
    (Triton and its OpenAI frontend); stopped cleanly at the end of the session."""
    from test_serve_triton import serving

    yield from serving(builtin, tmp_path_factory.mktemp("serve"))
