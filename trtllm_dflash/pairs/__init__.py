"""Model pairs shipped with the package.

`stdlib`: the built-in default pair. A 6-layer Qwen3 target pre-trained on this project's offline
corpus (the Python standard library's sources, byte-level BPE tokenizer of 2048 tokens) and a
2-layer DFlash drafter (block 16) trained for it with `dflash-train`, and a DFlash2 drafter of the same
shape trained the same way (`dflash-train --method dflash2`). About 40 MB, float32. `recipe.json` records
how they were made; `benchmarks/make_builtin_pair.py` reproduces them.
"""

from __future__ import annotations

from pathlib import Path

from ..utils.errors import DFlashError

STDLIB = Path(__file__).parent / "stdlib"
HELD_OUT_SEED = 1234
DRAFTERS = {"dflash": "drafter", "dflash2": "drafter_dflash2"}  # drafting method -> its drafter's directory


def stdlib_pair(method: str = "dflash") -> tuple[Path, Path]:
    """-> (target_dir, drafter_dir) of the shipped pair, with the drafter of `method` (dflash, dflash2)."""
    target, drafter = STDLIB / "target", STDLIB / DRAFTERS[method]
    for path in (target, drafter):
        if not (path / "model.safetensors").is_file():
            raise DFlashError(f"the built-in pair is missing {path / 'model.safetensors'} (a broken install?)")
    return target, drafter


def held_out_texts(count: int, seed: int = HELD_OUT_SEED) -> list[str]:
    """Code snippets of stdlib files that neither the tokenizer, the target nor the drafter saw
    (trtllm_dflash/train/corpus.py holds 1 file in 16 out)."""
    from ..train.corpus import snippets, split, stdlib_sources

    return snippets(split(stdlib_sources())[1], count, seed)
