"""Cold and warm start of the built-in pair's engine, per step mode: `dflash-generate --engine` to exit and
`dflash-serve` to ready (GET /v2/health/ready answers).

    python benchmarks/startup.py [--device cpu|cuda | --gpu] [--step-modes compile] [--repeats 3] [--serve]
                                 [--shapes builtin|qwen3-8b|tiny] [--output benchmarks/results/startup_cpu.json]
    python benchmarks/startup.py --gpu --shapes qwen3-8b --step-modes cuda-graphs --cold-repeats 0 --serve  # a lease
    python benchmarks/startup.py --shapes tiny --repeats 1 --cold-repeats 1   # a smoke run of the random pair (CPU)
    python benchmarks/startup.py --step-modes eager --draft-len auto --serve --threads 1 --load  # a user's default

--shapes: the built-in pair in float32 (default), or gpu_decode.py's random-weight pair written as checkpoints
(config.json, model.safetensors, a word-level tokenizer over the vocabulary) and built as a published pair is:
Qwen3-8B shapes in bfloat16 with a 5-layer drafter, or its tiny smoke shapes in float32.

cold: the engine without stored graphs and an empty TORCHINDUCTOR_CACHE_DIR (every graph compiled, as before
`dflash-build compile` existed). warm: the engine after `dflash-build compile`, copied to a new path each run, and
an empty TORCHINDUCTOR_CACHE_DIR (the graphs come from the engine alone). Both run with a fixed `--draft-len`, so
neither calibrates: the graphs are what differs. `--step-modes eager` compiles nothing (its runs are "warm" only),
and `--draft-len auto` starts as a default `dflash-serve` does; `--load` keeps a dedicated busy second process
running throughout (serve_dflash_vs_plain.BusyProcess). Every run's output is checked equal to eager's; a warm run must
print no fall-back warning. Medians of --repeats with min and max; the JSON keeps the command and the device.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPT, NEW_TOKENS, DRAFT_LEN = "5,6,7,8", 32, "4"
SHAPES = ("builtin", "qwen3-8b", "tiny")
FALLBACK = "compiling them now"  # graph_store.use_stored_graphs' warning


def env(cache: Path) -> dict:
    return {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}


def generate(engine: Path, mode: str, device: str, threads: int, cache: Path,
             draft_len: str = DRAFT_LEN) -> tuple[float, list[int], str]:
    """-> (seconds to exit, output ids, stderr)."""
    command = [sys.executable, "-m", "trtllm_dflash.cli.generate", "--engine", str(engine), "--step-mode", mode,
               "--device", device, "--threads", str(threads), "--prompt-ids", PROMPT, "--max-new-tokens",
               str(NEW_TOKENS), "--ignore-eos", "--draft-len", draft_len, "--json"]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env(cache))
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"startup.py: {' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return seconds, json.loads(done.stdout)["output_ids"], done.stderr


def serve(engine: Path, mode: str, threads: int, cache: Path, work: Path,
          draft_len: str = DRAFT_LEN) -> tuple[float, str]:
    """-> (seconds until ready, the server's stderr up to then); the server is stopped after."""
    from trtllm_dflash.engine.loader import free_port

    ports = [str(free_port()) for _ in range(3)]
    log = work / f"serve-{time.monotonic_ns()}.log"
    command = [sys.executable, "-m", "trtllm_dflash.cli.serve", str(engine), "--model-repo", str(work / "repo"),
               "--step-mode", mode, "--threads", str(threads), "--draft-len", draft_len, "--http-port", ports[0],
               "--grpc-port", ports[1], "--metrics-port", ports[2]]
    start = time.perf_counter()
    with open(log, "w") as err:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, env=env(cache), start_new_session=True)
    try:
        while proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ports[0]}/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        return time.perf_counter() - start, log.read_text()
            except OSError:
                pass
            time.sleep(0.2)
        sys.exit(f"startup.py: dflash-serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
    finally:
        proc.terminate()
        proc.wait(60)


def random_pair(shapes: str, work: Path, device: str) -> tuple[Path, Path, str]:
    """gpu_decode.py's random-weight pair as checkpoint directories -> (target, drafter, dtype). The tensors are
    drawn on `device` (16 GB at Qwen3-8B shapes: seconds on a GPU) and saved from the host."""
    import torch
    from safetensors.torch import save_file

    sys.path.insert(0, str(Path(__file__).parent))
    from gpu_decode import QWEN3_8B, TINY, configs, random_checkpoint
    from trtllm_dflash.config.model import DrafterConfig, TargetConfig

    from trtllm_dflash.models.drafter import DFlashDrafter
    from trtllm_dflash.models.target import TargetModel

    tiny = shapes == "tiny"
    shape, dtype = (TINY, torch.float32) if tiny else (QWEN3_8B, torch.bfloat16)
    t_raw, d_raw = configs(shape, 2 if tiny else 5)
    for name, raw, model, parse in (("target", t_raw, TargetModel, TargetConfig),
                                    ("drafter", d_raw, DFlashDrafter, DrafterConfig)):
        path = work / shapes / name
        path.mkdir(parents=True)
        (path / "config.json").write_text(json.dumps({**raw, "torch_dtype": str(dtype).removeprefix("torch.")}))
        tensors = random_checkpoint(model, parse.from_dict(raw, name), device, dtype)
        save_file({k: v.cpu() for k, v in tensors.items()}, str(path / "model.safetensors"))
        del tensors
    word_tokenizer(work / shapes / "target", shape["vocab_size"])
    return work / shapes / "target", work / shapes / "drafter", str(dtype).removeprefix("torch.")


def word_tokenizer(path: Path, vocab: int) -> None:
    """A word-level tokenizer over the whole vocabulary ('t0' .. 't{vocab - 1}'), so every output id decodes."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="t1", unk_token="t0").save_pretrained(str(path))


def summary(values: list[float]) -> dict:
    return {"median_s": statistics.median(values), "min_s": min(values), "max_s": max(values),
            "runs_s": [round(v, 2) for v in values]}


def measure(base: Path, compiled: Path, mode: str, args, work: Path, eager_ids: list[int]) -> dict:
    runs: dict[str, list[float]] = {}
    for phase in ("cold", "warm"):
        for r in range(args.cold_repeats if phase == "cold" else args.repeats):
            engine = Path(shutil.copytree(base if phase == "cold" else compiled, work / f"{phase}-{mode}-{r}" / "e"))
            cache = Path(tempfile.mkdtemp(dir=work, prefix="inductor-"))  # empty
            seconds, ids, err = generate(engine, mode, args.device, args.threads, cache, args.draft_len)
            if ids != eager_ids:
                sys.exit(f"startup.py: {phase} {mode} output differs from eager: {ids} vs {eager_ids}")
            if phase == "warm" and FALLBACK in err:
                sys.exit(f"startup.py: the warm run compiled: {err[-2000:]}")
            runs.setdefault(f"generate_{phase}", []).append(seconds)
            if args.serve:
                cache = Path(tempfile.mkdtemp(dir=work, prefix="inductor-"))
                seconds, err = serve(engine, mode, args.threads, cache, work, args.draft_len)
                runs.setdefault(f"serve_{phase}", []).append(seconds)
                runs.setdefault(f"serve_{phase}_log", []).append(
                    next((line for line in err.splitlines() if "start-up:" in line), ""))
    return {k: summary(v) if k.endswith(("cold", "warm")) else v for k, v in runs.items()}


def measure_mode(base: Path, mode: str, args, work: Path, eager_ids: list[int]) -> dict:
    """`dflash-build compile` of a copy (not for eager, which compiles nothing), then `measure`."""
    if mode == "eager":
        return measure(base, base, mode, argparse.Namespace(**{**vars(args), "cold_repeats": 0}), work, eager_ids)
    compiled = Path(shutil.copytree(base, work / f"compiled-{mode}" / "e"))
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "trtllm_dflash.cli.build", "compile", str(compiled), "--device",
                    args.device, "--step-mode", mode, "--threads", str(args.threads), "--no-calibrate"],
                   check=True, env=env(work / f"inductor-build-{mode}"))
    return {"dflash_build_compile_s": time.perf_counter() - start,
            **measure(base, compiled, mode, args, work, eager_ids)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--gpu", action="store_true", help="the same as --device cuda, with cuda-graphs and compile")
    p.add_argument("--step-modes", help="comma-separated (default: compile on a CPU, cuda-graphs,compile on CUDA)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cold-repeats", type=int, help="cold runs (default --repeats; each compiles every graph)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--serve", action="store_true", help="also time dflash-serve to ready (needs tritonserver)")
    p.add_argument("--shapes", choices=SHAPES, default="builtin",
                   help="the pair: built-in (float32), or random weights at Qwen3-8B shapes (bfloat16) or tiny ones")
    p.add_argument("--draft-len", default=DRAFT_LEN, help=f"--draft-len of every run (default {DRAFT_LEN}; auto: a "
                   "default dflash-serve's); eager's output is the reference either way")
    p.add_argument("--load", action="store_true", help="a dedicated busy second process for the whole run")
    p.add_argument("--output", type=Path)
    args = p.parse_args()
    if args.gpu:
        args.device = "cuda"
    args.cold_repeats = args.repeats if args.cold_repeats is None else args.cold_repeats
    cuda = args.device.startswith("cuda")
    modes = (args.step_modes or ("cuda-graphs,compile" if cuda else "compile")).split(",")
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(Path(__file__).parent))
    import torch
    from serve_dflash_vs_plain import BusyProcess
    from trtllm_dflash.engine.calibrate import device_name

    from trtllm_dflash.builder.builder import build_engine
    from trtllm_dflash.builder.spec import BuildSpec
    from trtllm_dflash.pairs import stdlib_pair

    work = Path(tempfile.mkdtemp(prefix="dflash-startup-"))
    target, drafter, dtype = stdlib_pair() + ("float32",) if args.shapes == "builtin" else random_pair(
        args.shapes, work, args.device)
    base = build_engine(BuildSpec(str(target), str(drafter), str(work / "engine"), dtype=dtype), "startup.py")
    eager_ids = generate(base, "eager", args.device, args.threads, work / "inductor-eager")[1]
    record = {"command": "python " + " ".join(sys.argv), "shapes": args.shapes,
              "device": device_name(torch.device(args.device)), "torch": torch.__version__, "threads": args.threads,
              "repeats": args.repeats, "cold_repeats": args.cold_repeats, "draft_len": args.draft_len,
              "background_load": "a dedicated busy python process for the whole run" if args.load else None,
              "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "load_average_before": os.getloadavg(), "modes": {}}
    with BusyProcess() if args.load else contextlib.nullcontext():
        for mode in modes:
            record["modes"][mode] = measure_mode(base, mode, args, work, eager_ids)
            print(json.dumps({mode: record["modes"][mode]}), flush=True)
    record["load_average_after"] = os.getloadavg()
    text = json.dumps(record, indent=1) + "\n"
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)
    print(text)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
