"""Compiled graphs stored in the engine (`dflash-build compile`, graph_store.py): an engine copied to another path
and run with an empty inductor cache loads them, compiles nothing (dynamo's and inductor's counters) and decodes
exactly as eager; damaged, truncated or foreign sets fall back to compiling with one warning line, never a crash or
another token; verify and inspect report them. One tiny engine is compiled once for the module (about 80 s of CPU)."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from helpers.tiny_models import add_tokenizer, drafter_config, make_hf_target, write_drafter
from trtllm_dflash.config.manifest import Manifest

from trtllm_dflash.compilation.graph_store import GRAPHS, INDEX, KERNELS, ArtefactError, GraphStore

pytestmark = pytest.mark.slow  # inductor compiles and fresh processes
PROMPTS = [((5, 6, 7), 20), ((9, 8), 12)]
# a fresh process: load the engine, note the counters, generate, note them again
PROBE = """
import json, sys, torch
torch.set_num_threads(1)
from torch._dynamo.utils import counters
from trtllm_dflash.engine.loader import load_engine
from trtllm_dflash.compilation.graph_store import inductor_counts
from trtllm_dflash.engine.request import Request
pipeline = load_engine(sys.argv[1], step_mode="compile", max_batch=json.loads(sys.argv[3]))
loaded = [inductor_counts(), counters["stats"]["unique_graphs"]]
out = pipeline.generator.generate([Request(p, n, ignore_eos=True) for p, n in json.loads(sys.argv[2])])
print(json.dumps({"load": loaded, "end": [inductor_counts(), counters["stats"]["unique_graphs"]],
                  "graphs": pipeline.startup["graphs"], "ids": [r.output_ids for r in out]}))
"""


def run(args, cache_dir, **kw):
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, **kw)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """A tiny engine (target 2 layers, drafter 1, block 4) with its compile-mode graphs for 1 thread."""
    from trtllm_dflash.builder.builder import build_engine
    from trtllm_dflash.builder.spec import BuildSpec

    root = tmp_path_factory.mktemp("compiled")
    make_hf_target(root / "t", num_hidden_layers=2)
    add_tokenizer(root / "t")
    write_drafter(root / "d", drafter_config(target_layers=2, layers=1, block_size=4))
    out = build_engine(BuildSpec(str(root / "t"), str(root / "d"), str(root / "e"), dtype="float32", max_seq_len=64,
                                 max_batch_size=4), "test")
    done = run(["-m", "trtllm_dflash.cli.build", "compile", str(out), "--threads", "1", "--no-calibrate"],
               root / "inductor-build")
    assert done.returncode == 0, done.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def eager_ids(engine):
    from trtllm_dflash.engine.loader import load_engine
    from trtllm_dflash.engine.request import Request

    generator = load_engine(engine, step_mode="eager").generator
    return [r.output_ids for r in generator.generate([Request(p, n, ignore_eos=True) for p, n in PROMPTS])]


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("inductor-warm")


def copy(engine, tmp_path) -> Path:
    return Path(shutil.copytree(engine, tmp_path / "moved" / "engine"))


def only_set(engine) -> Path:
    (directory,) = GraphStore(engine).sets()
    return directory


def test_a_copied_engine_loads_its_graphs_and_compiles_nothing(engine, eager_ids, warm_cache, tmp_path):
    moved = copy(engine, tmp_path)
    done = run(["-c", PROBE, str(moved), json.dumps(PROMPTS), "null"], warm_cache)  # an empty inductor cache
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    counts, graphs = out["load"]
    assert counts["compiled"] == 0 and counts["loaded"] > 0 and out["graphs"] == "loaded"
    assert out["end"] == out["load"]  # the requests compiled nothing either, nor traced a new graph
    assert out["ids"] == eager_ids
    assert "warning" not in done.stderr


def test_a_one_request_load_traces_the_one_row_graphs_and_its_request_nothing_more(engine, eager_ids, tmp_path):
    """dflash-generate's load (one request: max_batch 1) warms only the one-row graphs; its request, run to the
    end, traces no graph the load did not, with an inductor cache of its own (nothing but the engine's set)."""
    moved = copy(engine, tmp_path)
    done = run(["-c", PROBE, str(moved), json.dumps(PROMPTS[:1]), "1"], tmp_path / "inductor")
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    counts, graphs = out["load"]
    assert counts["compiled"] == 0 and counts["loaded"] > 0 and out["graphs"] == "loaded"
    assert out["end"] == out["load"]
    assert out["ids"] == eager_ids[:1]


@pytest.mark.parametrize("damage", ["truncate", "foreign"])
def test_damaged_or_foreign_graphs_fall_back_to_compiling_with_one_warning(engine, eager_ids, warm_cache, tmp_path,
                                                                          damage):
    """dflash-generate --engine, the user's path; the inductor cache is the warm one the test above filled, so the
    fall-back's compilation is quick (it still decodes through torch.compile, not eagerly)."""
    moved = copy(engine, tmp_path)
    directory = only_set(moved)
    if damage == "truncate":
        data = (directory / GRAPHS).read_bytes()
        (directory / GRAPHS).write_bytes(data[: len(data) // 2])
    else:  # another machine's set under this key's name
        index = json.loads((directory / INDEX).read_text())
        index["key"]["device"] = "cuda: another GPU"
        (directory / INDEX).write_text(json.dumps(index))
    (prompt, n), = PROMPTS[:1]
    done = run(["-m", "trtllm_dflash.cli.generate", "--engine", str(moved), "--step-mode", "compile", "--threads", "1",
                "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", str(n), "--ignore-eos",
                "--draft-len", "3", "--json"], warm_cache)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["output_ids"] == eager_ids[0]
    warnings = [line for line in done.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and directory.name in warnings[0]  # names the key ...
    assert f"dflash-build compile {moved} --device cpu --step-mode compile" in warnings[0]  # ... and the command
    assert "Traceback" not in done.stderr


def write_set(engine_dir: Path, key: dict, graphs: bytes) -> Path:
    """A stored set by hand (no compilation): graphs.bin, an empty kernels.tar and a manifest that agrees."""
    directory = GraphStore(engine_dir).path(key)
    directory.mkdir(parents=True)
    (directory / GRAPHS).write_bytes(graphs)
    tarfile.open(directory / KERNELS, "w").close()
    files = {name: {"sha256": hashlib.sha256((directory / name).read_bytes()).hexdigest(),
                    "bytes": (directory / name).stat().st_size} for name in (GRAPHS, KERNELS)}
    (directory / INDEX).write_text(json.dumps({"key": key, "files": files}))
    return directory


def test_unusable_sets_raise_artefact_error_and_load_nothing(tmp_path):
    """Without a compiled engine: sets written by hand, each unusable in its own way."""
    key = {"device": "cpu: test", "threads": 1, "step_mode": "compile"}
    directory = write_set(tmp_path, key, b"not a cache" * 10)  # damaged, with a manifest that agrees with it
    store = GraphStore(tmp_path)
    with pytest.raises(ArtefactError, match="none stored for this key .*differs in threads 1 there, 7 here"):
        store.load({**key, "threads": 7})
    with pytest.raises(ArtefactError, match="graphs.bin did not load"):
        store.load(key)
    index = json.loads((directory / INDEX).read_text())
    (directory / INDEX).write_text(json.dumps({**index, "files": {GRAPHS: "?"}}))
    with pytest.raises(ArtefactError, match="manifest.json unreadable"):
        store.load(key)
    (directory / INDEX).write_text(json.dumps({**index, "key": {**key, "threads": 2}}))  # another key's set
    with pytest.raises(ArtefactError, match="its manifest's key hashes to"):
        store.load(key)


def test_a_kernel_archive_may_only_hold_libraries_below_the_cache(tmp_path):
    from trtllm_dflash.compilation.graph_store import unpack_kernels

    (tmp_path / "evil.so").write_bytes(b"x")
    with tarfile.open(tmp_path / KERNELS, "w") as tar:
        tar.add(tmp_path / "evil.so", arcname="../evil.so")
    with pytest.raises(ArtefactError, match="unexpected member '../evil.so'"):
        unpack_kernels(tmp_path / KERNELS, tmp_path / "cache")


def test_verify_checks_the_sets_hashes_and_inspect_lists_their_keys(engine, tmp_path):
    moved = copy(engine, tmp_path)
    name = only_set(moved).name
    inspect = run(["-m", "trtllm_dflash.cli.build", "inspect", str(moved)], tmp_path)
    assert inspect.returncode == 0
    (line,) = [x for x in inspect.stdout.splitlines() if x.startswith("graphs")]
    assert name in line and "1 threads" in line and ", compile;" in line and " MiB" in line
    assert Manifest.read(moved).check_files(moved) == []  # the sets are not build files
    verify = run(["-m", "trtllm_dflash.cli.build", "verify", str(moved)], tmp_path)
    assert verify.returncode == 0 and f"compiled graphs {name}: intact" in verify.stdout
    with open(moved / "compiled" / name / KERNELS, "r+b") as f:
        f.truncate(100)
    verify = run(["-m", "trtllm_dflash.cli.build", "verify", str(moved)], tmp_path)
    assert verify.returncode == 1
    assert f"FAIL compiled graphs {name}/{KERNELS}: size or sha256 differs from its manifest" in verify.stdout


def test_compile_refuses_eager_in_one_line(engine, tmp_path):
    done = run(["-m", "trtllm_dflash.cli.build", "compile", str(engine), "--step-mode", "eager"], tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == ("dflash-build: error: step mode eager compiles nothing: use --step-mode compile "
                                   "or cuda-graphs")
