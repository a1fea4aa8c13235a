"""The offline corpus of the built-in pair: this Python's own standard-library sources.

Every machine with Python has them, so the built-in pair is reproducible without a network. Files
are split by a hash of their path relative to the stdlib root (not by position), so the held-out
set is the same on every machine with the same Python version and never depends on file order.
Test packages are left out: they are mostly fixtures and generated data.
"""

from __future__ import annotations

import hashlib
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

EOS, MASK = "<|endoftext|>", "<|MASK|>"
HELD_OUT_MODULUS = 16  # 1 file in 16 is held out: never used for the tokenizer, the target or the drafter
SKIPPED_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


@dataclass(frozen=True)
class SourceFile:
    relpath: str  # relative to the stdlib root, '/'-separated
    text: str

    @property
    def held_out(self) -> bool:
        digest = hashlib.sha1(self.relpath.encode()).digest()
        return int.from_bytes(digest[:4], "big") % HELD_OUT_MODULUS == 0


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_sources(root: Path | None = None) -> list[SourceFile]:
    """All non-test .py files under the stdlib, sorted by path; undecodable files are skipped."""
    root = root or stdlib_root()
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if SKIPPED_DIRS.intersection(rel.parts[:-1]):
            continue
        try:
            files.append(SourceFile(rel.as_posix(), path.read_text(encoding="utf-8")))
        except (UnicodeDecodeError, OSError):
            continue
    return files


def split(files: list[SourceFile]) -> tuple[list[SourceFile], list[SourceFile]]:
    """-> (training files, held-out files)."""
    return [f for f in files if not f.held_out], [f for f in files if f.held_out]


def train_tokenizer(files: list[SourceFile], vocab_size: int, out_dir: Path):
    """A byte-level BPE tokenizer (the `tokenizers` library) with EOS and the DFlash mask token,
    saved for transformers' AutoTokenizer. -> the PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS, MASK], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((f.text for f in files), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS, mask_token=MASK)
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    return fast


def snippets(files: list[SourceFile], count: int, seed: int) -> list[str]:
    """Prompts: `count` code snippets of 200-600 characters, each starting at a line of a random file."""
    files = [f for f in files if f.text.strip()]
    rng, out = random.Random(seed), []
    for _ in range(count):
        lines = rng.choice(files).text.splitlines(keepends=True)
        snippet = "".join(lines[rng.randrange(len(lines)):])[:rng.randrange(200, 600)]
        out.append(snippet if snippet.strip() else "import os\n")
    return out
