"""Compiled step graphs kept in the engine directory, one set per kind of machine, loaded by every later process.

What is stored: torch's portable compile caches ("mega-cache": `torch.compiler.save_cache_artifacts` /
`load_cache_artifacts`, torch/compiler/__init__.py, torch 2.13), which carry the FX-graph, AOTAutograd, inductor and
autotuning cache entries of every graph a warm-up compiled. Loaded before the warm-up, each of its compilations
becomes a cache hit: dynamo still traces the passes (seconds), inductor compiles nothing. On a CPU the entries
hold the C++ kernels' source, not their binaries (a hit without them ran g++ on all 70 kernels of the built-in
pair again), so the shared libraries the compile wrote to its own inductor cache are stored beside them
(`kernels.tar`) and unpacked into this process's inductor cache, where they are named by a hash of their source and
compiler command, never by a path: the engine directory stays relocatable. On CUDA the Triton kernels travel inside
the FX-graph entries (`bundle_triton_into_fx_graph_cache`, torch/_inductor/config.py); CUDA graphs are recorded at
load from the loaded kernels (cudagraph trees, `mode="reduce-overhead"`), which is cheap.

Why not AOTInductor packages (`aoti_compile_and_package` / `aoti_load_package`): a package runs one exported program.
The steps here are torch.compile'd modules (`step_mode.CompiledPass`) taking a context object, with sizes symbolic
except a size of 1, caches written in place and CUDA graphs recorded by inductor per bucket; an AOTI path would
export every pass and record graphs around them by hand, a second compiled path to keep equal to the first. The
caches keep the one path and take away its cost; what they cannot carry (a foreign torch, a changed graph) misses
and compiles as without them, so a wrong or damaged artefact costs time, never a token.

What a warm start still pays is dynamo tracing each graph it loads (most of a warm start:
benchmarks/results/startup_cpu.json), so a process traces only the graphs it can run
(`step_mode.compile_step_shapes`, max_batch), and one that prefills once does it eagerly (`engine.load_engine`).
Skipping dynamo too (torch's caching precompile, `torch._dynamo.aot_compile`): docs/compiled-engines.md.

Layout: ENGINE/compiled/<16 hex of the key>/{manifest.json, graphs.bin, kernels.tar}; manifest.json holds the key
and each file's sha256 and size, checked before anything is loaded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import tarfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config.manifest import GRAPH_STORE, sha256_file, sha256_json
from ..utils.device import device_name
from ..utils.errors import DFlashError

STORE = GRAPH_STORE  # inside the engine directory; not part of the build's checksums
INDEX = "manifest.json"
GRAPHS = "graphs.bin"  # torch.compiler.save_cache_artifacts()
KERNELS = "kernels.tar"  # C++ kernel binaries (CPU), paths relative to the inductor cache
BUILD_HINT = "dflash-build compile {engine} --device {device} --step-mode {mode}"


def triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def graph_key(manifest, device: torch.device | str, mode: str, rank: int = 0) -> dict:
    """What compiled graphs are valid for: the machine (device and, on CUDA, compute capability; on a CPU the
    thread count, which inductor's C++ kernels specialise on), the software (torch, triton, Python: kernels are
    Python extensions), the engine (its files' hashes, dtype, TP size and rank) and the step mode."""
    device = torch.device(device)
    key = {"device": device_name(device), "torch": torch.__version__, "triton": triton_version(),
           "python": platform.python_version(), "dtype": manifest.dtype, "tp_size": manifest.tp_size, "rank": rank,
           "step_mode": mode, "engine": sha256_json(manifest.files)[:16]}
    if device.type == "cuda":
        key["capability"] = "{}.{}".format(*torch.cuda.get_device_capability(device))
    else:
        key["threads"] = torch.get_num_threads()
    return key


def key_digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def describe(key: dict) -> str:
    """One line naming a key: digest, device, software, engine layout, mode."""
    where = key["device"] + (f" (sm {key['capability']})" if "capability" in key else f", {key['threads']} threads")
    return (f"{key_digest(key)}: {where}, torch {key['torch']}, triton {key['triton']}, python {key['python']}, "
            f"{key['dtype']}, tp {key['tp_size']} rank {key['rank']}, {key['step_mode']}")


def inductor_cache_dir() -> Path:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir())


class ArtefactError(Exception):
    """Stored graphs that cannot be used: the message says why; the caller compiles instead."""


@dataclass
class GraphStore:
    """The compiled-graph sets of one engine directory."""

    engine_dir: Path

    @property
    def root(self) -> Path:
        return Path(self.engine_dir) / STORE

    def path(self, key: dict) -> Path:
        return self.root / key_digest(key)

    def save(self, key: dict, cache_dir: Path, compile_s: float) -> Path:
        """Store this process's compile caches (save_cache_artifacts) and the kernel binaries under `cache_dir`
        (the inductor cache the compile wrote) for `key`, replacing any earlier set of that key."""
        graphs, _ = torch.compiler.save_cache_artifacts() or (b"", None)
        if not graphs:
            raise DFlashError("nothing was compiled, so there is nothing to store (is the step mode compiled?)")
        out = self.path(key)
        out.mkdir(parents=True, exist_ok=True)
        (out / GRAPHS).write_bytes(graphs)
        with tarfile.open(out / KERNELS, "w") as tar:
            for so in sorted(Path(cache_dir).rglob("*.so")):
                tar.add(so, arcname=str(so.relative_to(cache_dir)))
        files = {name: {"sha256": sha256_file(out / name), "bytes": (out / name).stat().st_size}
                 for name in (GRAPHS, KERNELS)}
        index = {"key": key, "files": files, "compile_s": round(compile_s, 1),
                 "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (out / INDEX).write_text(json.dumps(index, indent=2) + "\n")
        return out

    def index(self, directory: Path) -> dict:
        try:
            index = json.loads((directory / INDEX).read_text())
            files = index["files"]
            if not isinstance(index["key"], dict) or set(files) != {GRAPHS, KERNELS} or not all(
                    isinstance(f["sha256"], str) and isinstance(f["bytes"], int) for f in files.values()):
                raise ValueError("not a key and a sha256 and size for each file")
            return index
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ArtefactError(f"{directory / INDEX} unreadable ({type(exc).__name__}: {exc})") from None

    def problems(self, directory: Path) -> list[str]:
        """What is wrong with one stored set: its index, a missing file, a file whose size or hash differs."""
        try:
            index = self.index(directory)
        except ArtefactError as exc:
            return [str(exc)]
        problems = []
        if key_digest(index["key"]) != directory.name:
            problems.append(f"{directory.name}: its manifest's key hashes to {key_digest(index['key'])}")
        for name, want in index["files"].items():
            path = directory / name
            if not path.is_file():
                problems.append(f"{directory.name}/{name} missing")
            elif path.stat().st_size != want["bytes"] or sha256_file(path) != want["sha256"]:
                problems.append(f"{directory.name}/{name}: size or sha256 differs from its manifest")
        return problems

    def sets(self) -> list[Path]:
        return sorted(p for p in self.root.iterdir() if p.is_dir()) if self.root.is_dir() else []

    def nearest(self, key: dict) -> str:
        """How the closest stored key differs from `key` (a thread count, a torch version), for the warning."""
        diffs = []
        for directory in self.sets():
            try:
                stored = self.index(directory)["key"]
            except ArtefactError:
                continue
            diffs.append([f"{k} {stored.get(k)!r} there, {v!r} here" for k, v in key.items() if stored.get(k) != v])
        return f" (the nearest stored one differs in {', '.join(min(diffs, key=len))})" if diffs else ""

    def load(self, key: dict) -> None:
        """Pre-populate this process's compile caches with the set stored for `key`. Raises ArtefactError (nothing
        stored, damaged, foreign); loads nothing then, or only self-keyed cache entries that a graph must match."""
        directory = self.path(key)
        if not directory.is_dir():
            raise ArtefactError("none stored for this key" + self.nearest(key))
        problems = self.problems(directory)
        if problems:
            raise ArtefactError("; ".join(problems))
        if self.index(directory)["key"] != key:
            raise ArtefactError(f"{directory.name} was stored for another key")
        cache_log = logging.getLogger("torch.compiler._cache")  # logs a traceback for bytes it cannot read
        level = cache_log.level
        cache_log.setLevel(logging.CRITICAL)
        try:
            if torch.compiler.load_cache_artifacts((directory / GRAPHS).read_bytes()) is None:
                raise ArtefactError(f"{directory.name}/{GRAPHS} did not load (torch could not read it)")
            unpack_kernels(directory / KERNELS, inductor_cache_dir())
        except ArtefactError:
            raise
        except Exception as exc:  # whatever a damaged pickle raises: the caller compiles instead
            raise ArtefactError(f"{directory.name} did not load ({type(exc).__name__}: {exc})") from None
        finally:
            cache_log.setLevel(level)


def unpack_kernels(tar_path: Path, cache_dir: Path) -> int:
    """Kernel binaries into the inductor cache, each written to a temporary name and renamed (a reader never sees
    half a library); existing ones are kept. Members must be plain files below the cache. -> files written."""
    written = 0
    with tarfile.open(tar_path) as tar:
        for member in tar.getmembers():
            rel = Path(member.name)
            if not member.isfile() or rel.is_absolute() or ".." in rel.parts or rel.suffix != ".so":
                raise ArtefactError(f"{tar_path.name}: unexpected member {member.name!r}")
            dest = cache_dir / rel
            if dest.exists():
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.{os.getpid()}")
            with tar.extractfile(member) as src, open(tmp, "wb") as f:
                f.write(src.read())
            tmp.chmod(0o755)
            os.replace(tmp, dest)
            written += 1
    return written


def use_stored_graphs(engine_dir: Path, key: dict, device: str, log) -> bool:
    """Load the graphs stored for `key` before a compiled warm-up; -> whether they loaded. Missing or unusable:
    one warning line (via `log`, None on ranks other than 0) naming the key and the command that stores them."""
    try:
        GraphStore(engine_dir).load(key)
        return True
    except ArtefactError as exc:
        if log:
            hint = BUILD_HINT.format(engine=engine_dir, device=device, mode=key["step_mode"])
            hint += f" --threads {key['threads']}" if "threads" in key else ""
            log(f"warning: compiled graphs for key {describe(key)}: {exc}; compiling them now (minutes on a GPU): "
                f"`{hint}` stores them in the engine")
        return False


def inductor_counts() -> dict[str, int]:
    """Graphs compiled (fxgraph cache misses) and loaded (hits) by this process so far."""
    from torch._dynamo.utils import counters

    return {"compiled": counters["inductor"]["fxgraph_cache_miss"], "loaded": counters["inductor"]["fxgraph_cache_hit"]}


def inspect_lines(engine_dir: Path) -> list[str]:
    """`dflash-build inspect`: one line per stored key, with its size on disk."""
    lines = []
    for directory in GraphStore(Path(engine_dir)).sets():
        size = sum(p.stat().st_size for p in directory.iterdir() if p.is_file())
        try:
            index = GraphStore(Path(engine_dir)).index(directory)
            lines.append(f"graphs       {describe(index['key'])}; {size / 2**20:.1f} MiB, compiled in "
                         f"{index.get('compile_s', '?')} s")
        except ArtefactError as exc:
            lines.append(f"graphs       {directory.name}: {size / 2**20:.1f} MiB, unreadable ({exc})")
    return lines or ["graphs       none stored (dflash-build compile ENGINE_DIR stores them)"]


def verify_lines(engine_dir: Path) -> tuple[list[str], list[str]]:
    """`dflash-build verify`: -> (report lines, problems) over every stored set."""
    store = GraphStore(Path(engine_dir))
    lines, problems = [], []
    for directory in store.sets():
        found = store.problems(directory)
        problems += found
        lines += [f"FAIL compiled graphs {p}" for p in found] or [f"compiled graphs {directory.name}: intact"]
    return lines, problems


@contextmanager
def recording_timer():
    """-> a list whose first item is the seconds inductor's cudagraph trees spent recording CUDA graphs inside the
    block (`CUDAGraphTreeManager.record_function`, torch/_inductor/cudagraph_trees.py, torch 2.11 and 2.13)."""
    from torch._inductor.cudagraph_trees import CUDAGraphTreeManager

    spent, record = [0.0], CUDAGraphTreeManager.record_function

    def timed(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return record(self, *args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t0

    CUDAGraphTreeManager.record_function = timed
    try:
        yield spent
    finally:
        CUDAGraphTreeManager.record_function = record
