"""The tiny test pair: a random Qwen3 target with a byte tokenizer, and a DFlash drafter fitted to it.

Made by code from a seed in about 30 s (about 1 MB on disk), so the tests need neither a model hub
nor the shipped pair. The target is random, so its text is gibberish; the drafter is fitted to the
target's own greedy continuations, so acceptance is real. The CLI's `builtin` is the shipped,
trained pair instead (trtllm_dflash/pairs). The suite keeps it in pytest's cache dir (tests/conftest.py),
under a key of everything that decides its content (`pair_key`), so a second run does not refit it.
"""

from __future__ import annotations

import fcntl
import hashlib
import inspect
import json
import random
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from trtllm_dflash.models.drafter import DFlashDrafter
from trtllm_dflash.models.registry import parse_drafter_config, parse_target_config
from trtllm_dflash.models.target import TargetModel
from trtllm_dflash.train.distill import fit_drafter, target_continuations

VERSION = "v3"  # bump whenever the recipe changes: it names the cache directory
EOS, MASK = "<|endoftext|>", "<|MASK|>"
BYTE_VOCAB = 256  # ids 0..255 are bytes; 256 = EOS; 257 = MASK
TARGET = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 258, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 2048,
    "hidden_act": "silu", "tie_word_embeddings": False, "eos_token_id": 256, "torch_dtype": "float32",
}
DRAFTER = {
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "vocab_size": 258, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 2048,
    "hidden_act": "silu", "block_size": 8, "num_target_layers": 6, "torch_dtype": "float32",
    "dflash_config": {"mask_token_id": 257, "target_layer_ids": [1, 3]},
}


def pair_key(seed: int = 0, fit_steps: int = 600) -> str:
    """The cache directory's name: the recipe's version, seed and steps, and a hash of the files its weights come
    from (this one, the models', the fitting's) and of torch's version."""
    digest = hashlib.sha256(torch.__version__.encode())
    for path in sorted({__file__, *(inspect.getfile(f) for f in (DFlashDrafter, TargetModel, fit_drafter))}):
        digest.update(Path(path).read_bytes())
    return f"builtin-{VERSION}-seed{seed}-steps{fit_steps}-{digest.hexdigest()[:12]}"


def builtin_pair(home: Path, seed: int = 0, fit_steps: int = 600) -> tuple[Path, Path]:
    """-> (target_dir, drafter_dir), made on first use and cached under `home`."""
    root = home / pair_key(seed, fit_steps)
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel test workers: one fits, the others wait and read
        if not (root / "drafter" / "model.safetensors").is_file():
            tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix=".building-"))
            try:
                make_pair(tmp, seed, fit_steps)
                if root.exists():
                    shutil.rmtree(root)
                tmp.rename(root)  # atomic: a reader never sees a half-written pair
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return root / "target", root / "drafter"


def make_pair(root: Path, seed: int, fit_steps: int) -> None:
    torch.manual_seed(seed)
    target = random_target(seed)
    save_model(target, TARGET, root / "target")
    save_tokenizer(root / "target")
    (root / "target" / "generation_config.json").write_text(json.dumps({"eos_token_id": 256}))
    drafter = DFlashDrafter(parse_drafter_config(DRAFTER, "builtin drafter"))
    sequences = target_continuations(target, training_prompts(seed), 112)
    fit_drafter(target, drafter, sequences, min_anchor=4, steps=fit_steps, seed=seed)
    save_model(drafter, DRAFTER, root / "drafter")


def training_prompts(seed: int = 0, count: int = 512) -> list[list[int]]:
    """The drafter's training prompts: 16 random printable-ASCII bytes each."""
    rng = random.Random(seed)
    return [[rng.randrange(32, 127) for _ in range(16)] for _ in range(count)]


def held_out_prompts(count: int = 8) -> list[list[int]]:
    """Prompts of the training distribution that training never saw (another seed)."""
    return training_prompts(seed=10_000, count=count)


def random_target(seed: int) -> TargetModel:
    target = TargetModel(parse_target_config(TARGET, "builtin target"))
    torch.manual_seed(seed)  # after construction: the weights depend on the seed alone
    with torch.no_grad():
        for p in target.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.05)  # small weights: greedy output settles into learnable cycles
    return target.eval().requires_grad_(False)


def save_model(model: torch.nn.Module, config: dict, path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})


def save_tokenizer(path: Path) -> None:
    """A byte-level tokenizer: every byte one token, plus EOS and the DFlash mask token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_chars = sorted(alphabet, key=lambda c: _byte_of(c))
    vocab = {c: i for i, c in enumerate(byte_chars)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS, MASK])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS, mask_token=MASK)
    fast.save_pretrained(str(path))


def _byte_of(char: str) -> int:
    """The byte a GPT-2 byte-level character stands for."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    if ord(char) in printable:
        return ord(char)
    others = [b for b in range(256) if b not in printable]
    return others[ord(char) - 256]
