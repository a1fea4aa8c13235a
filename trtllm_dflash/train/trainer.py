"""dflash-train's loop: a DFlash or DFlash2 drafter trained against a frozen target, resumable, in the published format.

Per step: `rows_per_step` sequences, `anchors` random blocks in each one's response, the block-sparse
objective (objective.py), AdamW with linear warm-up then cosine decay, gradient clipping. The
target's embedding and LM head are shared and frozen. State (drafter, optimizer, schedule, sampler
RNG, step) is saved every `save_every` steps; `--resume` continues bit-for-bit on the same machine.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..checkpoint.drafter import Verifier, config_json, write_drafter
from ..checkpoint.hf import read_json
from ..checkpoint.loader import LoadedTarget, load_target
from ..config.model import DrafterConfig
from ..config.pairing import validate_pair
from ..engine.generator import Generator
from ..engine.request import Request, pooled_tau
from ..models.drafter import DFlashDrafter
from ..models.registry import parse_drafter_config
from ..speculative import drafter_proposer
from ..utils.errors import DFlashError
from . import dflash2
from .data import TrainingSet, encode, read_prompts, regenerate, stdlib_prompts
from .objective import block_loss, decay_weights
from .schedule import warmup_cosine
from .spec import TrainSpec, default_layer_ids

DEFAULT_PROMPTS = 4096  # stdlib snippets when no --data is given
SHARED_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
               "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings",
               "hidden_act", "attention_bias", "model_type")
FEATURE_CHUNK = 32  # sequences per target pass when capturing features


@dataclass
class Progress:
    """Hooks for the CLI's progress bar; all optional."""
    stage: callable = lambda name, total: None  # a new stage with `total` units
    advance: callable = lambda n=1, **info: None  # n units done, with loss / tau to show
    log: callable = print


@dataclass
class TrainState:
    step: int = 0
    losses: list[float] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)  # {"step", "tau"}


def drafter_config(spec: TrainSpec, target: LoadedTarget) -> dict:
    """The published DFlash (or DFlash2) config.json for a drafter of `target` with the spec's shape."""
    raw = read_json(target.path / "config.json")
    layers = target.config.num_hidden_layers
    ids = spec.target_layer_ids or default_layer_ids(layers, spec.num_layers)
    mask = spec.mask_token_id
    if mask is None:
        mask = getattr(target.tokenizer, "mask_token_id", None) if target.tokenizer is not None else None
        if mask is None:
            raise DFlashError(f"the target's tokenizer in {target.path} has no mask token: pass --mask-token-id")
    config = {k: raw[k] for k in SHARED_KEYS if k in raw}
    config.update({"architectures": ["DFlashDraftModel"], "num_hidden_layers": spec.num_layers,
                   "block_size": spec.block_size, "num_target_layers": layers, "torch_dtype": "float32",
                   "dflash_config": {"mask_token_id": int(mask), "target_layer_ids": list(ids)}})
    if spec.method == "dflash2":
        config = dflash2.config_fields(config)
    validate_pair(target.config, parse_drafter_config(config, "the new drafter's config"))
    return config


def new_drafter(d_cfg: DrafterConfig, target: LoadedTarget) -> DFlashDrafter:
    """torch's default initialisation; a DFlash2 drafter's own parts as speculators initialises them."""
    drafter = DFlashDrafter(d_cfg)
    if d_cfg.dflash2 is not None:
        std = read_json(target.path / "config.json").get("initializer_range", dflash2.INITIALIZER_RANGE)
        dflash2.initialise(drafter, std)
    return drafter


def total_steps(spec: TrainSpec, rows: int) -> int:
    if spec.steps is not None:
        return spec.steps
    return max(1, math.ceil((spec.epochs or 6) * rows / spec.rows_per_step))


def prepare_data(spec: TrainSpec, target: LoadedTarget, progress: Progress) -> tuple[TrainingSet, list[list[int]]]:
    """(training set, held-out eval prompts); cached in the state dir so a resumed run reuses it."""
    cache = spec.state_dir / "data.pt"
    if spec.resume and cache.is_file():
        saved = torch.load(cache)
        return TrainingSet(**saved["train"]), saved["eval"]
    if target.tokenizer is None:
        raise DFlashError(f"the target in {target.path} has no tokenizer: dflash-train needs one to read prompts")
    texts = read_prompts(Path(spec.data), target.tokenizer) if spec.data else stdlib_prompts(DEFAULT_PROMPTS, spec.seed)
    prompts = encode(texts, target.tokenizer, spec.max_prompt_tokens)
    if len(prompts) <= spec.eval_prompts:
        raise DFlashError(f"{len(prompts)} prompts leave none for training after holding out --eval-prompts "
                          f"{spec.eval_prompts}")
    train_prompts, eval_prompts = prompts[:len(prompts) - spec.eval_prompts], prompts[len(prompts) - spec.eval_prompts:]
    limit = target.config.max_position_embeddings - spec.max_new_tokens
    train_prompts = [p[-limit:] for p in train_prompts]
    progress.stage("regenerating responses with the target", len(train_prompts))
    data = regenerate(target.model, train_prompts, spec.max_new_tokens, target.stop_ids,
                      target.tokenizer.pad_token_id or 0, lambda n: progress.advance(n))
    spec.state_dir.mkdir(parents=True, exist_ok=True)
    torch.save({"train": data.__dict__, "eval": eval_prompts}, cache)
    return data, eval_prompts


@torch.no_grad()
def capture(target, sequences: torch.Tensor, layer_ids, device: str) -> torch.Tensor:
    """[N, S] ids -> [N, S, len(ids) * hidden] target features, stored in bfloat16 on the CPU (memory)."""
    from .distill import capture_features

    chunks = [capture_features(target, sequences[i:i + FEATURE_CHUNK].to(device), tuple(layer_ids)).to("cpu",
              torch.bfloat16) for i in range(0, len(sequences), FEATURE_CHUNK)]
    return torch.cat(chunks)


@torch.no_grad()
def held_out_tau(target, drafter, prompts: list[list[int]], stop_ids, max_new_tokens: int) -> float:
    """Pooled tokens per verify step of greedy decoding with the drafter's method on the held-out prompts."""
    if not prompts:
        return float("nan")
    drafter.eval()
    results = Generator(target, drafter_proposer(drafter, target), tuple(stop_ids)).generate(
        [Request(tuple(p), max_new_tokens) for p in prompts])
    drafter.train()
    return pooled_tau(results)


def saved_config(spec: TrainSpec, target: LoadedTarget, config: dict, d_cfg: DrafterConfig) -> dict:
    """config.json in --save-format (the speculators format names the target as its verifier)."""
    verifier = Verifier.of(spec.target, target.path) if spec.save_format == "speculators" else None
    return config_json(config, d_cfg, spec.save_format, verifier)


def save_state(spec: TrainSpec, state: TrainState, drafter, opt, sched, rng: torch.Generator) -> None:
    path = spec.state_dir / "checkpoint.pt"
    torch.save({"fingerprint": spec.fingerprint(), "step": state.step, "losses": state.losses, "evals": state.evals,
                "drafter": drafter.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                "rng": rng.get_state()}, path.with_suffix(".tmp"))
    os.replace(path.with_suffix(".tmp"), path)


def load_state(spec: TrainSpec, drafter, opt, sched, rng: torch.Generator) -> TrainState:
    path = spec.state_dir / "checkpoint.pt"
    if not spec.resume or not path.is_file():
        return TrainState()
    saved = torch.load(path, weights_only=False)
    if saved["fingerprint"] != spec.fingerprint():
        raise DFlashError(f"--resume: {path} was made with different settings (fingerprint {saved['fingerprint']}, "
                          f"now {spec.fingerprint()})")
    drafter.load_state_dict(saved["drafter"])
    opt.load_state_dict(saved["optimizer"])
    sched.load_state_dict(saved["scheduler"])
    rng.set_state(saved["rng"])
    return TrainState(saved["step"], saved["losses"], saved["evals"])


def check_output(spec: TrainSpec) -> None:
    out = Path(spec.output)
    if out.exists() and not spec.resume and any(out.iterdir()):
        raise DFlashError(f"--output {out} exists and is not empty (use --resume to continue a run there)")


def train(spec: TrainSpec, progress: Progress = Progress()) -> TrainState:
    """Run (or resume) a training run; the drafter lands in spec.output in --save-format (z-lab's or speculators')."""
    check_output(spec)
    target = load_target(spec.target, torch.float32, spec.device)
    config = drafter_config(spec, target)
    d_cfg = parse_drafter_config(config, "the new drafter's config")
    out_config = saved_config(spec, target, config, d_cfg)  # a format that cannot hold it fails before any work
    target.model.requires_grad_(False)  # frozen: the shared embedding and LM head included
    data, eval_prompts = prepare_data(spec, target, progress)
    rows = data.usable(spec.block_size)
    if len(rows) == 0:
        raise DFlashError(f"no response is at least --block-size {spec.block_size} tokens long: "
                          "raise --max-new-tokens or check that the target does not stop at once")
    progress.stage("capturing target features", 1)
    features = capture(target.model, data.sequences, d_cfg.target_layer_ids, spec.device)
    progress.advance(1)
    torch.manual_seed(spec.seed)
    drafter = new_drafter(d_cfg, target).to(spec.device).train()
    steps = total_steps(spec, len(rows))
    opt = torch.optim.AdamW(drafter.parameters(), lr=spec.lr, weight_decay=spec.weight_decay)
    warmup = max(1, round(spec.warmup * steps))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: warmup_cosine(i, warmup, steps))
    rng = torch.Generator().manual_seed(spec.seed)
    state = load_state(spec, drafter, opt, sched, rng)
    weights = decay_weights(spec.block_size).to(spec.device)
    progress.stage("training", steps)
    progress.advance(state.step)
    while state.step < steps:
        loss = train_step(spec, data, rows, features, target.model, drafter, opt, sched, rng, weights)
        state.losses.append(loss)
        state.step += 1
        info = {"loss": sum(state.losses[-20:]) / len(state.losses[-20:])}
        if state.step % spec.eval_every == 0 or state.step == steps:
            tau = held_out_tau(target.model, drafter, eval_prompts, target.stop_ids, min(128, spec.max_new_tokens))
            state.evals.append({"step": state.step, "tau": tau})
            info["tau"] = tau
        if state.step % spec.save_every == 0 or state.step == steps:
            save_state(spec, state, drafter, opt, sched, rng)
        progress.advance(1, **info)
    write_drafter(Path(spec.output), out_config,
                  {k: v.detach().to("cpu", torch.float32) for k, v in drafter.state_dict().items()})
    (spec.state_dir / "log.json").write_text(json.dumps({"spec": spec.__dict__, "steps": steps,
                                                         "evals": state.evals, "losses": state.losses}) + "\n")
    return state


def train_step(spec, data: TrainingSet, rows, features, target, drafter, opt, sched, rng, weights) -> float:
    pick = rows[torch.randint(len(rows), (spec.rows_per_step,), generator=rng)]
    lo = data.prompt_lengths[pick].float()  # [R] first legal anchor: the first response position
    span = (data.lengths[pick] - spec.block_size - data.prompt_lengths[pick] + 1).float()  # [R] legal anchors
    u = torch.rand(len(pick), spec.anchors, generator=rng)
    anchors = (lo[:, None] + (u * span[:, None]).floor()).long()  # [R, A] uniform over each row's range
    seqs, feats = data.sequences[pick], features[pick]
    width = int((anchors.max() + spec.block_size).item())  # nothing past the last block is read
    device = spec.device
    loss = block_loss(drafter, target, seqs[:, :width].to(device), feats[:, :width].to(device, torch.float32),
                      anchors.to(device), weights)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(drafter.parameters(), spec.grad_clip)
    opt.step()
    sched.step()
    return loss.item()
