"""TrainSpec: every setting of one `dflash-train` run, validated before any work starts."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ..utils.errors import DFlashError
from .dflash2 import METHODS


def default_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """The reference's choice: one target layer per drafter layer, spread over 1 .. L - 3."""
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    start, end = 1, max(1, num_target_layers - 3)
    return tuple(int(round(start + i * (end - start) / (num_draft_layers - 1))) for i in range(num_draft_layers))


@dataclass(frozen=True)
class TrainSpec:
    target: str
    output: str
    data: str | None = None  # prompts JSONL; None: snippets of this Python's stdlib sources
    num_layers: int = 5
    block_size: int = 16
    target_layer_ids: tuple[int, ...] | None = None  # None: default_layer_ids
    steps: int | None = None
    epochs: float | None = None  # used when steps is None; the recipe's 6 by default
    lr: float = 6e-4
    batch_tokens: int = 4096  # drafter query tokens per step = sequences x anchors x block
    anchors: int = 8  # random blocks per sequence and step
    warmup: float = 0.04  # fraction of the steps
    grad_clip: float = 1.0
    weight_decay: float = 0.0
    max_prompt_tokens: int = 256  # prompts are cut to their last N tokens
    max_new_tokens: int = 256  # length of the target's regenerated responses (greedy, stops at EOS)
    eval_prompts: int = 16  # the data's last N prompts: held out, used for the periodic tau
    eval_every: int = 500
    save_every: int = 200
    mask_token_id: int | None = None  # None: the tokenizer's mask token
    device: str = "cpu"
    seed: int = 0
    resume: bool = False
    save_format: str = "zlab"  # the written drafter's checkpoint format: zlab | speculators
    method: str = "dflash"  # dflash | dflash2 (convolutions and a candidate selector, train/dflash2.py)

    def __post_init__(self):
        positive = ("num_layers", "lr", "batch_tokens", "anchors", "max_prompt_tokens", "max_new_tokens",
                    "eval_every", "save_every")
        for name in positive:
            if getattr(self, name) <= 0:
                raise DFlashError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        if self.block_size < 2:
            raise DFlashError(f"--block-size must be at least 2, got {self.block_size}")
        if self.steps is not None and self.epochs is not None:
            raise DFlashError("give --steps or --epochs, not both")
        if (self.steps is not None and self.steps < 1) or (self.epochs is not None and self.epochs <= 0):
            raise DFlashError(f"--steps/--epochs must be positive, got {self.steps or self.epochs}")
        if not 0 <= self.warmup < 1:
            raise DFlashError(f"--warmup must be a fraction in [0, 1), got {self.warmup}")
        if self.eval_prompts < 0:
            raise DFlashError(f"--eval-prompts must be >= 0, got {self.eval_prompts}")
        if self.save_format not in ("zlab", "speculators"):
            raise DFlashError(f"--save-format must be zlab or speculators, got {self.save_format!r}")
        if self.method not in METHODS:
            raise DFlashError(f"--method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise DFlashError(f"unknown device {self.device!r} (cpu, cuda or cuda:N)")

    @property
    def rows_per_step(self) -> int:
        return max(1, self.batch_tokens // (self.anchors * self.block_size))

    def fingerprint(self) -> str:
        """Digest of everything that shapes the run (not its length or bookkeeping): a resumed run must match."""
        fixed = {k: v for k, v in asdict(self).items()
                 if k not in ("resume", "steps", "epochs", "eval_every", "save_every", "device", "output",
                              "save_format")}
        return hashlib.sha256(json.dumps(fixed, sort_keys=True, default=list).encode()).hexdigest()[:16]

    @property
    def state_dir(self) -> Path:
        return Path(self.output) / "train_state"
