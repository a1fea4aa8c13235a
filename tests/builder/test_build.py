"""dflash-build: engines for both backends, tensor-parallel exactness, quantization, bad input."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from helpers.tiny_models import add_tokenizer, drafter_config, make_hf_target, write_drafter
from trtllm_dflash.checkpoint.loader import check_weights
from trtllm_dflash.config.manifest import Manifest

from trtllm_dflash.builder import builder
from trtllm_dflash.builder.trtllm.fields import check_options
from trtllm_dflash.cli.build import main as build_main
from trtllm_dflash.models.drafter import DFlashDrafter
from trtllm_dflash.models.registry import parse_drafter_config, parse_target_config

PROMPTS = ["5,9,13,2,77,31,8", "40,41,42,43,44,45,46,47,48,49,50,51"]  # short, and longer than a block


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """Tiny (target, drafter) directories: Qwen3 GQA, Llama GQA, and a target with 1 KV head."""
    root = tmp_path_factory.mktemp("pairs")
    made = {}
    for name, kind, extra in (("qwen3", "qwen3", {}), ("llama", "llama", {}),
                              ("qwen3-kv1", "qwen3", {"num_key_value_heads": 1})):
        target = root / f"{name}-target"
        make_hf_target(target, kind, seed=11, **extra)
        add_tokenizer(target)
        drafter = write_drafter(root / f"{name}-drafter", drafter_config(**extra), seed=12)
        made[name] = (target, drafter)
    return made


def build(*args) -> int:
    return build_main([str(a) for a in args])


def generate_json(*args) -> dict:
    proc = subprocess.run([sys.executable, "-m", "trtllm_dflash.cli.generate", *map(str, args), "--json"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def outputs(prompt, *model_args):
    d = generate_json(*model_args, "--prompt-ids", prompt, "--max-new-tokens", "24", "--ignore-eos")
    return d["output_ids"], d["acceptance_lengths"]


@pytest.mark.parametrize("name", ["qwen3", "llama", "qwen3-kv1"])
def test_tp2_engine_equals_tp1_and_unsharded(pairs, tmp_path, name):
    target, drafter = pairs[name]
    for tp in (1, 2):
        assert build("--target", target, "--drafter", drafter, "--output", tmp_path / f"tp{tp}", "--tp", tp,
                     "--dtype", "float32") == 0
    # one fixed draft length (the whole block), so acceptance is comparable: `auto` times steps per process
    k = json.loads((tmp_path / "tp1" / "manifest.json").read_text())["block_size"] - 1
    plain = outputs(PROMPTS[1], "--target", target, "--drafter", drafter, "--draft-len", k)
    assert outputs(PROMPTS[1], "--engine", tmp_path / "tp1", "--draft-len", k) == plain
    assert outputs(PROMPTS[1], "--engine", tmp_path / "tp2", "--draft-len", k) == plain


def test_tp2_engine_keeps_real_acceptance(builtin, tmp_path):
    from helpers.tiny_pair import held_out_prompts

    target, drafter = builtin
    assert build("--target", target, "--drafter", drafter, "--output", tmp_path / "e", "--tp", 2, "--dtype", "float32") == 0
    prompt = ",".join(map(str, held_out_prompts(2)[1]))
    k = json.loads((tmp_path / "e" / "manifest.json").read_text())["block_size"] - 1  # fixed: comparable acceptance
    plain = outputs(prompt, "--target", target, "--drafter", drafter, "--draft-len", k)
    assert outputs(prompt, "--engine", tmp_path / "e", "--draft-len", k) == plain and max(plain[1]) > 1


def test_engine_shards_reassemble_to_the_original(pairs, tmp_path):
    from trtllm_dflash.checkpoint.sharding import unshard_state
    from trtllm_dflash.config.model import read_config_json

    target, drafter = pairs["qwen3-kv1"]
    build("--target", target, "--drafter", drafter, "--output", tmp_path / "e", "--tp", 2, "--dtype", "float32")
    cfg = parse_target_config(read_config_json(target), "t")
    shards = [load_file(str(tmp_path / "e" / "target" / f"rank{r}.safetensors")) for r in range(2)]
    assert shards[0]["model.layers.0.self_attn.k_proj.weight"].shape[0] == cfg.head_dim  # 1 KV head, replicated
    full = unshard_state(shards, cfg, cfg.vocab_size)
    original = load_file(str(target / "model.safetensors"))
    assert full.keys() == original.keys()
    for k in original:
        assert torch.equal(full[k], original[k]), k


@pytest.mark.parametrize("heads, kv_heads, vocab, world", [(4, 2, 98, 4), (4, 1, 96, 2), (8, 8, 101, 2), (4, 4, 96, 1)])
def test_shard_then_unshard_is_identity(heads, kv_heads, vocab, world):
    from trtllm_dflash.checkpoint.sharding import shard_state, unshard_state

    from trtllm_dflash.distributed.parallel import Parallel
    from trtllm_dflash.models.target import TargetModel

    cfg = parse_target_config({"model_type": "qwen3", "vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64,
                                  "num_hidden_layers": 2, "num_attention_heads": heads,
                                  "num_key_value_heads": kv_heads, "head_dim": 8, "attention_bias": True}, "cfg")
    torch.manual_seed(0)
    state = {k: torch.randn(v.shape) for k, v in TargetModel(cfg).state_dict().items()}
    shards = [shard_state(state, cfg, r, world) for r in range(world)]
    for r, shard in enumerate(shards):  # every shard fits the rank's own model exactly
        with torch.device("meta"):
            check_weights(TargetModel(cfg, Parallel(r, world)), shard, Path("shard"))
    full = unshard_state(shards, cfg, vocab)
    assert all(torch.equal(full[k], state[k]) for k in state)


def test_trtllm_engine_options_and_published_drafter_layout(pairs, tmp_path):
    target, drafter = pairs["qwen3"]
    out = tmp_path / "trt"
    assert build("--target", target, "--drafter", drafter, "--output", out, "--backend", "trtllm", "--tp", 2,
                 "--block-size", 6, "--max-seq-len", 256) == 0
    options = yaml.safe_load((out / "llm_options.yaml").read_text())
    assert check_options(options) == []  # every key and value TorchLlmArgs accepts, nothing deprecated
    # the drafter path is relative to the engine (it can move); ids and mask are the drafter's; no GPU here: VANILLA
    assert options["speculative_config"] == {"decoding_type": "DFlash", "max_draft_len": 5, "speculative_model": "drafter",
                                             "mask_token_id": 95, "target_layer_ids": [1, 1],
                                             "attention_backend": "VANILLA"}
    assert options["tensor_parallel_size"] == 2 and options["max_seq_len"] == 256
    cfg = json.loads((out / "drafter" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and "dflash_config" in cfg
    with torch.device("meta"):
        check_weights(DFlashDrafter(parse_drafter_config(cfg, "d")),
                      load_file(str(out / "drafter" / "model.safetensors")), out)
    m = Manifest.read(out)
    assert m.backend == "trtllm" and m.backend_details["min_tensorrt_llm"] and m.block_size == 6


@pytest.mark.parametrize("quant, algo, weight_dtype", [("fp8", "FP8", torch.float8_e4m3fn), ("nvfp4", "NVFP4", torch.uint8)])
def test_model_optimizer_quantization_on_cpu(pairs, tmp_path, quant, algo, weight_dtype):
    target, drafter = pairs["qwen3"]
    calib = tmp_path / "calib.jsonl"
    calib.write_text('{"prompt": "t5 t6 t7 t8"}\n{"text": "t40 t41 t42"}\n')
    out = tmp_path / quant
    assert build("--target", target, "--drafter", drafter, "--output", out, "--backend", "trtllm", "--quant", quant,
                 "--calib", calib) == 0
    m = Manifest.read(out)
    assert m.quantization == quant and m.backend_details["quant_algo"] == algo
    assert json.loads((out / "target" / "hf_quant_config.json").read_text())["quantization"]["quant_algo"] == algo
    with safe_open(str(out / "target" / "model.safetensors"), "pt") as f:
        assert f.get_tensor("model.layers.0.mlp.up_proj.weight").dtype == weight_dtype
        assert "model.layers.0.mlp.up_proj.weight_scale" in f.keys()


def test_inspect_and_verify(pairs, tmp_path, capsys):
    target, drafter = pairs["llama"]
    out = tmp_path / "e"
    build("--target", target, "--drafter", drafter, "--output", out, "--tp", 2)
    capsys.readouterr()
    assert build_main(["inspect", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["tp_size"] == 2 and info["dtype"] == "bfloat16" and len(info["files"]) == 9
    assert info["build_command"].startswith("dflash-build --target ")
    assert build_main(["inspect", str(out)]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("kv pool")]
    t, d = (json.loads((out / role / "config.json").read_text()) for role in ("target", "drafter"))
    head_dim = t.get("head_dim") or t["hidden_size"] // t["num_attention_heads"]
    # per rank: K and V of every target and drafter layer, half the KV heads, bfloat16
    per_token = (t["num_hidden_layers"] + d["num_hidden_layers"]) * 2 * t["num_key_value_heads"] // 2 * head_dim * 2
    assert f"{per_token:,} B of K/V per token per rank (bfloat16" in line
    assert build_main(["verify", str(out)]) == 0
    assert capsys.readouterr().out.strip().endswith("engine OK")
    shard = out / "drafter" / "rank1.safetensors"
    shard.write_bytes(shard.read_bytes()[:-8] + b"\0" * 8)
    assert build_main(["verify", str(out)]) == 1
    report = capsys.readouterr().out
    assert "FAIL checksum mismatch for drafter/rank1.safetensors" in report and "engine BROKEN" in report


def test_yaml_config_with_flag_overrides(pairs, tmp_path):
    target, drafter = pairs["qwen3"]
    cfg = tmp_path / "build.yaml"
    cfg.write_text(yaml.safe_dump({"target": str(target), "drafter": str(drafter), "output": str(tmp_path / "x"),
                                   "tp": 2, "dtype": "float16", "max-batch-size": 8}))
    assert build("--config", cfg, "--output", tmp_path / "y", "--dtype", "float32") == 0
    m = Manifest.read(tmp_path / "y")
    assert (m.tp_size, m.dtype, m.limits["max_batch_size"]) == (2, "float32", 8)
    assert not (tmp_path / "x").exists()


# ---- bad input: one line naming the problem, exit 2, nothing written ------------------------------------

def expect_error(capsys, needle, *args):
    code = build(*args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("dflash-build: error: "), err
    assert needle in err[0], err[0]


def no_leftovers(parent: Path, name: str) -> bool:
    return not any(p.name.startswith(f".{name}.building-") or p.name == name for p in parent.iterdir())


def test_mismatched_pair(capsys, pairs, tmp_path):
    target, _ = pairs["qwen3"]
    cfg = drafter_config(hidden=48)
    from helpers.tiny_models import drafter_weights
    bad = write_drafter(tmp_path / "d", cfg, drafter_weights(cfg))
    expect_error(capsys, "drafter hidden_size 48 != target hidden_size 32",
                 "--target", target, "--drafter", bad, "--output", tmp_path / "out")
    assert no_leftovers(tmp_path, "out")


def test_corrupt_shard(capsys, pairs, tmp_path):
    import shutil
    target, drafter = pairs["qwen3"]
    broken = Path(shutil.copytree(target, tmp_path / "t"))
    (broken / "model.safetensors").write_bytes(b"garbage")
    expect_error(capsys, f"corrupt safetensors file {broken / 'model.safetensors'}",
                 "--target", broken, "--drafter", drafter, "--output", tmp_path / "out")
    assert no_leftovers(tmp_path, "out")


def test_unwritable_output(capsys, pairs, tmp_path):
    target, drafter = pairs["qwen3"]
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    expect_error(capsys, f"cannot write the engine under {blocker}",
                 "--target", target, "--drafter", drafter, "--output", blocker / "engine")


def test_existing_output_needs_force(capsys, pairs, tmp_path):
    target, drafter = pairs["qwen3"]
    pair = ("--target", target, "--drafter", drafter)
    assert build(*pair, "--output", tmp_path / "out") == 0
    first = Manifest.read(tmp_path / "out").created_utc, (tmp_path / "out" / "manifest.json").stat().st_ino
    expect_error(capsys, f"output {tmp_path / 'out'} already exists (use --force to replace it)",
                 *pair, "--output", tmp_path / "out")
    assert (tmp_path / "out" / "manifest.json").stat().st_ino == first[1]
    assert build(*pair, "--output", tmp_path / "out", "--force") == 0  # an engine is replaced
    assert (tmp_path / "out" / "manifest.json").stat().st_ino != first[1]
    (tmp_path / "empty").mkdir()
    assert build(*pair, "--output", tmp_path / "empty", "--force") == 0  # so is an empty directory
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary sibling left


def test_force_never_deletes_what_is_not_an_engine(capsys, pairs, tmp_path, monkeypatch):
    target, drafter = pairs["qwen3"]
    pair = ("--target", target, "--drafter", drafter, "--force")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "keep.txt").write_text("user data")
    expect_error(capsys, f"--force replaces only an engine directory (with manifest.json) or an empty one, and "
                 f"{tmp_path / 'data'} is neither", *pair, "--output", tmp_path / "data")
    monkeypatch.chdir(tmp_path / "data")
    expect_error(capsys, "is neither", *pair, "--output", ".")
    assert (tmp_path / "data" / "keep.txt").read_text() == "user data"
    (tmp_path / "file").write_text("a file")
    expect_error(capsys, f"output {tmp_path / 'file'} exists and is not a directory", *pair, "--output",
                 tmp_path / "file")
    (tmp_path / "link").symlink_to(tmp_path / "data")
    expect_error(capsys, f"output {tmp_path / 'link'} is a symbolic link", *pair, "--output", tmp_path / "link")
    assert (tmp_path / "file").read_text() == "a file" and (tmp_path / "data" / "keep.txt").exists()


def test_engine_files_follow_the_umask(pairs, tmp_path):
    import os
    import stat

    target, drafter = pairs["qwen3"]
    old = os.umask(0o027)
    try:
        assert build("--target", target, "--drafter", drafter, "--output", tmp_path / "out") == 0
    finally:
        os.umask(old)
    modes = {p.relative_to(tmp_path): stat.S_IMODE(p.stat().st_mode) for p in [tmp_path / "out",
                                                                              *(tmp_path / "out").rglob("*")]}
    assert modes[Path("out")] == 0o750 and modes[Path("out/target/rank0.safetensors")] == 0o640
    assert {m for p, m in modes.items() if (tmp_path / p).is_dir()} == {0o750}
    assert {m for p, m in modes.items() if (tmp_path / p).is_file()} == {0o640}


@pytest.mark.parametrize("text, needle", [
    ('force: "no"\n', "build spec: 'force' must be true or false, got 'no'"),
    ("force: 1\n", "build spec: 'force' must be true or false, got 1"),
    ('tp: "2"\n', "build spec: 'tp' must be a positive integer, got '2'"),
    ("max_seq_len: 1.5\n", "build spec: 'max_seq_len' must be a positive integer, got 1.5"),
    ("backend: [torch]\n", "build spec: unknown backend ['torch']"),
    ("calib: 7\nbackend: trtllm\nquant: fp8\n", "build spec: 'calib' must be a file path, got 7"),
])
def test_yaml_values_are_checked_like_flags(capsys, pairs, tmp_path, text, needle):
    """A YAML `force: "no"` once counted as true and deleted the existing output."""
    target, drafter = pairs["qwen3"]
    assert build("--target", target, "--drafter", drafter, "--output", tmp_path / "out") == 0
    before = (tmp_path / "out" / "manifest.json").stat().st_ino
    cfg = tmp_path / "b.yaml"
    cfg.write_text(f"target: {target}\ndrafter: {drafter}\noutput: {tmp_path / 'out'}\n{text}")
    expect_error(capsys, needle, "--config", cfg)
    assert (tmp_path / "out" / "manifest.json").stat().st_ino == before


def test_yaml_builtin_pair_like_the_flags(tmp_path):
    cfg = tmp_path / "b.yaml"
    cfg.write_text(f"target: builtin\ndrafter: builtin\noutput: {tmp_path / 'out'}\nmax_seq_len: 256\n")
    assert build("--config", cfg) == 0
    m = Manifest.read(tmp_path / "out")
    assert m.target["source"].endswith("pairs/stdlib/target") and m.drafter["source"].endswith("pairs/stdlib/drafter")


@pytest.mark.parametrize("flags, needle", [
    (["--tp", "3"], "tensor-parallel size 3 does not divide the target's num_attention_heads 4"),
    (["--backend", "tensorrt"], "unknown backend 'tensorrt' (choose from torch, trtllm)"),
    (["--dtype", "fp64"], "unknown dtype 'fp64'"),
    (["--quant", "int3", "--backend", "trtllm"], "unknown quant 'int3' (choose from none, fp8, nvfp4)"),
    (["--quant", "fp8"], "quant 'fp8' needs backend 'trtllm'"),
    (["--block-size", "9"], "block size 9 exceeds the drafter's trained block_size 8"),
    (["--max-seq-len", "4096"], "max_seq_len 4096 exceeds the target's max_position_embeddings 512"),
])
def test_bad_settings(capsys, pairs, tmp_path, flags, needle):
    target, drafter = pairs["qwen3"]
    expect_error(capsys, needle, "--target", target, "--drafter", drafter, "--output", tmp_path / "out", *flags)
    assert no_leftovers(tmp_path, "out")


@pytest.mark.parametrize("text, needle", [
    ("target: a\ndrafter: b\noutput: c\nbackned: torch\n", "unknown key 'backned'"),
    ("target: [unclosed\n", "is not valid YAML at line"),
    ("- just\n- a list\n", "must hold a YAML mapping"),
    (b"target: \xff\xfe\n", "is not valid YAML"),
])
def test_bad_yaml(capsys, tmp_path, text, needle):
    cfg = tmp_path / "b.yaml"
    cfg.write_bytes(text if isinstance(text, bytes) else text.encode())
    expect_error(capsys, needle, "--config", cfg)


def test_calibration_file_not_utf8(capsys, pairs, tmp_path):
    target, drafter = pairs["qwen3"]
    calib = tmp_path / "c.jsonl"
    calib.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    expect_error(capsys, f"{calib}:2: not UTF-8 text (byte 0xe9 at column 16)", "--target", target,
                 "--drafter", drafter, "--output", tmp_path / "o", "--backend", "trtllm", "--quant", "fp8",
                 "--calib", calib)


def test_target_without_tokenizer(capsys, workdir, random_drafter, tmp_path):
    target = workdir / "no-tok-target"
    make_hf_target(target, "qwen3", seed=3)
    capsys.readouterr()  # transformers' save progress
    expect_error(capsys, "has no tokenizer", "--target", target, "--drafter", random_drafter, "--output", tmp_path / "o")


def test_bad_calibration_file_names_the_line(capsys, pairs, tmp_path):
    target, drafter = pairs["qwen3"]
    calib = tmp_path / "c.jsonl"
    calib.write_text('{"prompt": "t1"}\n{oops\n')
    expect_error(capsys, f"{calib}: line 2 is not valid JSON", "--target", target, "--drafter", drafter,
                 "--output", tmp_path / "o", "--backend", "trtllm", "--quant", "fp8", "--calib", calib)
    assert no_leftovers(tmp_path, "o")


def test_interrupted_build_leaves_nothing(pairs, tmp_path, monkeypatch):
    target, drafter = pairs["qwen3"]
    real = builder.write_backend

    def interrupted(plan, tmp):
        real(plan, tmp)  # everything written, then the user hits Ctrl-C before the rename
        assert any(tmp.iterdir())
        raise KeyboardInterrupt

    monkeypatch.setattr(builder, "write_backend", interrupted)
    assert build("--target", target, "--drafter", drafter, "--output", tmp_path / "out") == 130
    assert no_leftovers(tmp_path, "out")


# ---- signals: a real dflash-build process stopped mid-build ----------------------------------------------

SLOW_BUILD = """
import sys, time
from pathlib import Path
from trtllm_dflash.builder import builder
from trtllm_dflash.cli.build import main
real = builder.write_backend
def slow(plan, tmp):  # everything written, then wait for the signal
    details = real(plan, tmp)
    Path(sys.argv[1]).write_text(str(tmp))
    time.sleep(120)
    return details
builder.write_backend = slow
sys.exit(main(sys.argv[2:]))
"""


def start_slow_build(tmp_path, target, drafter, out):
    import time

    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_BUILD, str(ready), "--target", str(target), "--drafter",
                             str(drafter), "--output", str(out)], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.05)
    assert any(Path(ready.read_text()).iterdir())  # mid-build: the temporary sibling holds the engine's files
    return proc, Path(ready.read_text())


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGHUP"])
def test_signal_mid_build_leaves_nothing(pairs, tmp_path, signum):
    import signal

    target, drafter = pairs["qwen3"]
    proc, tmp = start_slow_build(tmp_path, target, drafter, tmp_path / "out")
    proc.send_signal(getattr(signal, signum))
    err = proc.stderr.read()
    assert proc.wait(60) == 128 + getattr(signal, signum)
    assert err.strip() == f"dflash-build: stopped by {signum}"
    assert not tmp.exists() and no_leftovers(tmp_path, "out")


def test_killed_build_is_swept_by_the_next(pairs, tmp_path):
    """SIGKILL cannot be caught: the next build of the same output removes the dead build's sibling, and only
    that (a live build's sibling stops it; a look-alike that is not ours is left alone)."""
    import os
    import signal

    from trtllm_dflash.utils.output_dir import start_time

    target, drafter = pairs["qwen3"]
    proc, tmp = start_slow_build(tmp_path, target, drafter, tmp_path / "out")
    proc.send_signal(signal.SIGKILL)
    proc.wait(60)
    assert tmp.is_dir()  # left behind
    (tmp_path / ".out.building-notours").mkdir()
    assert build("--target", target, "--drafter", drafter, "--output", tmp_path / "out") == 0
    assert not tmp.exists() and (tmp_path / ".out.building-notours").is_dir()
    live = tmp_path / f".out2.building-{os.getpid()}-{start_time(os.getpid())}-abc"
    live.mkdir()
    assert build("--target", target, "--drafter", drafter, "--output", tmp_path / "out2") == 2
    assert live.is_dir() and not (tmp_path / "out2").exists()


# ---- builds that fail for the output's sake: another build at once, a read-only parent, a full disk --------

def test_a_second_build_of_one_output_at_once_is_refused(capsys, pairs, tmp_path):
    """While one build writes an output, another into the same output is one line naming the first's pid, and
    leaves the first's work alone; the first, stopped, leaves nothing (its lock file neither)."""
    import signal

    target, drafter = pairs["qwen3"]
    proc, tmp = start_slow_build(tmp_path, target, drafter, tmp_path / "out")
    try:
        expect_error(capsys, f"another dflash-build (pid {proc.pid}) is writing {tmp_path / 'out'}",
                     "--target", target, "--drafter", drafter, "--output", tmp_path / "out", "--force")
        assert any(tmp.iterdir())
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    assert not any(tmp_path.glob(".out*")) and not (tmp_path / "out").exists()


def in_mount(tmp_path: Path, options: str, script: str) -> subprocess.CompletedProcess:
    """`script` (sh) with a tmpfs of `options` mounted on tmp_path/mnt in a private mount namespace (unshare -rm:
    root in a user namespace, so no privilege is needed and nothing stays mounted)."""
    import shutil

    if shutil.which("unshare") is None:
        pytest.skip("no unshare")
    (tmp_path / "mnt").mkdir(exist_ok=True)
    probe = subprocess.run(["unshare", "-rm", "mount", "-t", "tmpfs", "tmpfs", str(tmp_path / "mnt")],
                           capture_output=True, text=True)
    if probe.returncode:
        pytest.skip(f"cannot mount a tmpfs in a user namespace: {probe.stderr.strip()}")
    return subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o {options} tmpfs {tmp_path / 'mnt'} && "
                           f"cd {tmp_path / 'mnt'} && {script}"], capture_output=True, text=True, timeout=600)


def build_line(target, drafter, out: str, *extra: str) -> str:
    return (f"{sys.executable} -m trtllm_dflash.cli.build --target {target} --drafter {drafter} --output {out} "
            + " ".join(extra))


@pytest.mark.slow
def test_read_only_parent_and_full_disk_are_one_line_and_keep_the_users_engine(pairs, tmp_path):
    """On a tmpfs: read-only, a build is refused before it loads anything; too small, refused by the free-space
    check; with too few inodes for a second engine, `--force` over the first fails mid-write in one line, leaves
    no partial engine, and the first engine still verifies."""
    target, drafter = pairs["qwen3"]
    build_cmd = lambda out, *extra: build_line(target, drafter, out, *extra)  # noqa: E731
    ro = in_mount(tmp_path, "ro", f"{build_cmd('engine')}; echo rc=$?; ls -A")
    assert ro.stderr.strip().splitlines()[-1] == (f"dflash-build: error: cannot write the engine under "
                                                 f"{tmp_path / 'mnt'}: Read-only file system"), ro.stderr
    assert ro.stdout.split() == ["rc=2"]
    small = in_mount(tmp_path, "size=64k", f"{build_cmd('engine')}; echo rc=$?; ls -A")
    assert "dflash-build: error: not enough free disk space under" in small.stderr and small.stdout.split() == ["rc=2"]
    assert build("--target", target, "--drafter", drafter, "--output", tmp_path / "ref") == 0
    inodes = 1 + sum(1 for _ in (tmp_path / "ref").rglob("*"))  # the engine's files and folders, itself too
    # the mount's root, one engine, and half of another's (its lock file included): the second runs out mid-write
    full = in_mount(tmp_path, f"size=256m,nr_inodes={1 + inodes + inodes // 2}",
                    f"{build_cmd('engine')} && {build_cmd('engine', '--force')}; echo rc=$?; echo left: $(ls -A); "
                    f"{sys.executable} -m trtllm_dflash.cli.build verify engine")
    assert full.stderr.strip().splitlines()[-1] == (f"dflash-build: error: writing {tmp_path / 'mnt' / 'engine'} "
                                                   "failed: No space left on device; nothing was left behind"), \
        full.stderr
    lines = full.stdout.splitlines()
    assert "rc=2" in lines and "left: engine" in lines  # the first engine, alone: no sibling, no lock left
    assert full.stdout.strip().endswith("engine OK")
