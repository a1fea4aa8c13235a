"""Fixtures every folder shares. The helpers they use live in tests/helpers (importable: pyproject's pythonpath)."""

import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():  # Triton kernels run on the CPU through Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

from helpers.engines import EngineFactory  # noqa: E402
from helpers.tiny_models import make_hf_target, write_drafter  # noqa: E402
from helpers.triton import serving  # noqa: E402


def _one_lane_per_worker() -> None:
    """Under pytest-xdist, worker gwN runs on core N alone (its affinity), and so do the servers and CLIs it starts
    (they inherit it and size their torch threads from it: utils/threads.py). Two workers each at two threads on two
    cores wait at each other's thread barriers; two one-core lanes do not."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker.startswith("gw") and len(cores) >= count > 1:
        os.sched_setaffinity(0, {cores[int(worker[2:]) % len(cores)]})


_one_lane_per_worker()
torch.set_num_threads(min(2, len(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else 2)


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
def pair():
    """The shipped pair: a real drafter (acceptance well above 0), a target transformers loads."""
    from trtllm_dflash.pairs import stdlib_pair

    return stdlib_pair()


@pytest.fixture(scope="session")
def builtin_home(tmp_path_factory) -> Path:
    """A private user cache for the session (step-cost models and the like); subprocesses find it through
    TRTLLM_DFLASH_HOME."""
    home = tmp_path_factory.mktemp("home")
    os.environ["TRTLLM_DFLASH_HOME"] = str(home)
    return home


@pytest.fixture(scope="session")
def builtin(request, builtin_home):
    """The tiny test pair (helpers/tiny_pair.py): fitted once, then kept in pytest's cache dir across runs."""
    from helpers.tiny_pair import builtin_pair

    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider: fitted for this run alone
    return builtin_pair(cache.mkdir("tiny-pair") if cache else builtin_home / "tiny-pair")


@pytest.fixture(scope="session")
def engine_factory(tmp_path_factory) -> EngineFactory:
    """Engines built once per session, one per BuildSpec; tests read them and never write into them."""
    return EngineFactory(tmp_path_factory.mktemp("engines"))


@pytest.fixture(scope="session")
def triton_server(builtin, tmp_path_factory):
    """The real tritonserver serving a tiny torch engine of the test pair, shared by the serving tests
    (Triton and its OpenAI frontend); stopped cleanly at the end of the session."""
    yield from serving(builtin, tmp_path_factory.mktemp("serve"))
