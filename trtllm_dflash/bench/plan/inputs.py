"""The plan's inputs: one validated record, built once from the flags (or from Python), passed whole."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from ...config.model import DrafterConfig, read_config_json
from ...models.registry import parse_drafter_config
from ...utils.errors import DFlashError
from .acceptance import AcceptanceProfile, geometric, read_profile
from .dflash2 import Dflash2Shape, split
from .step import VERIFY_ATTENTION

DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
DEFAULT_LEVELS = (50.0, 100.0, 200.0, 300.0, 500.0)


@dataclass(frozen=True)
class PlanSpec:
    """What `dflash-bench plan` plans; errors name the flag."""

    target: str                      # an AIConfigurator model id (Qwen/Qwen3-8B) or a directory with config.json
    drafter: str                     # a DFlash drafter directory (config.json)
    gpu: str                         # an AIConfigurator system: h100_sxm, b300_sxm, gb200 ... (or h100, b300)
    gpus: int                        # GPUs of the node: TP x replicas
    isl: int = 1024
    osl: int = 1024
    tp: tuple[int, ...] = ()         # TP sizes to try; () = every power of two dividing gpus
    acceptance: str | None = None    # a profile file (acceptance.py), or
    tau: float | None = None         # a mean acceptance length at the drafter's block size (geometric model)
    interactivity: tuple[float, ...] = DEFAULT_LEVELS  # tok/s/user floors of the table
    backend_version: str = "current"  # a TensorRT-LLM version slot of AIConfigurator's database
    batches: tuple[int, ...] = DEFAULT_BATCHES          # running batch sizes per replica
    verify_attention: str = "per-query"  # how verify attention reads the KV cache (step.VERIFY_ATTENTION)
    eagle3: str | None = None         # an EAGLE-3 drafter (its config.json): the second baseline
    eagle3_acceptance: str | None = None  # its profile file, or
    eagle3_tau: float | None = None   # its mean acceptance length at eagle3_max_draft_len (geometric model)
    eagle3_max_draft_len: int = 3     # the longest chain planned (the tau's draft length)
    output: str | None = None

    def __post_init__(self):
        for name in ("gpus", "isl", "osl"):
            if getattr(self, name) < 1:
                raise DFlashError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.osl < 2:
            raise DFlashError(f"--osl must be >= 2 (decode steps follow the first token), got {self.osl}")
        if (self.acceptance is None) == (self.tau is None):
            raise DFlashError("give one of --acceptance FILE or --tau T")
        bad = [t for t in self.tp_sizes() if t < 1 or self.gpus % t]
        if bad:
            raise DFlashError(f"--tp {bad[0]} must divide --gpus {self.gpus}")
        if not self.batches or min(self.batches) < 1:
            raise DFlashError(f"--batches must be positive, got {list(self.batches)}")
        if self.verify_attention not in VERIFY_ATTENTION:
            raise DFlashError(f"--verify-attention {self.verify_attention!r}: choose {' or '.join(VERIFY_ATTENTION)}")
        if self.eagle3 is not None and (self.eagle3_acceptance is None) == (self.eagle3_tau is None):
            raise DFlashError("--eagle3 needs one of --eagle3-acceptance FILE or --eagle3-tau T")
        if self.eagle3 is None and (self.eagle3_acceptance, self.eagle3_tau) != (None, None):
            raise DFlashError("--eagle3-acceptance / --eagle3-tau need --eagle3 DIR (the drafter's config.json)")
        if self.eagle3_max_draft_len < 1:
            raise DFlashError(f"--eagle3-max-draft-len must be >= 1, got {self.eagle3_max_draft_len}")
        if not self.interactivity or min(self.interactivity) <= 0:
            raise DFlashError(f"--interactivity must be positive tok/s/user, got {list(self.interactivity)}")

    def tp_sizes(self) -> tuple[int, ...]:
        return self.tp or tuple(t for t in (1, 2, 4, 8, 16, 32, 64) if t <= self.gpus and self.gpus % t == 0)

    def to_dict(self) -> dict:
        return {**asdict(self), "tp": list(self.tp_sizes())}


def read_drafter(where: str) -> tuple[DrafterConfig, str, Dflash2Shape | None]:
    """(the drafter's config, its config.json path, its DFlash2 shape or None): a directory or the config.json
    itself; the method (DFlash, DFlash2; z-lab's or speculators' layout) from the config (dflash2.split)."""
    path = Path(where)
    folder = path.parent if path.name == "config.json" else path
    if not folder.is_dir():
        raise DFlashError(f"--drafter {where!r}: no such directory (give a drafter directory with its config.json)")
    source = str(folder / "config.json")
    data, shape = split(read_config_json(folder), source)
    return parse_drafter_config(data, source), source, shape


def target_id(where: str) -> str:
    """What AIConfigurator's get_model takes: a directory with config.json, else a model id it ships."""
    path = Path(where)
    if path.name == "config.json":
        path = path.parent
    return str(path) if path.is_dir() else where


def acceptance_profile(spec: PlanSpec, drafter: DrafterConfig) -> AcceptanceProfile:
    """The measured file, or the geometric model at the drafter's block size. A file measured at draft lengths
    below block_size - 1 plans only the draft lengths it covers (search.Grid.max_draft_len)."""
    if spec.acceptance is not None:
        return read_profile(spec.acceptance)
    return geometric(spec.tau, drafter.block_size)


def eagle3_profile(spec: PlanSpec) -> AcceptanceProfile | None:
    """The baseline's acceptance: its file, or the geometric model over eagle3_max_draft_len positions."""
    if spec.eagle3 is None:
        return None
    if spec.eagle3_acceptance is not None:
        return read_profile(spec.eagle3_acceptance)
    return geometric(spec.eagle3_tau, spec.eagle3_max_draft_len + 1)
