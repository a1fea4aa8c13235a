"""How an engine runs, whoever runs it: `RuntimeConfig`, validated once and passed whole.

dflash-generate builds it from its flags (`from_flags`), a served torch model from its Triton model parameters
(`from_triton_params`, the inverse of `triton_params`, which `dflash-serve` writes into config.pbtxt); the
generator takes it in one call (`Generator.configure`). A field's flag and parameter share its name
(`max_num_tokens`: `--max-num-tokens`), and an error names the one the value came from.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from ..utils.errors import DFlashError

AUTO = "auto"  # --step-mode and --draft-len: the runtime chooses
STEP_MODES = ("eager", "compile", "cuda-graphs")  # compilation/step_mode.py
DECODINGS = ("dflash", "plain")  # plain: the target alone, autoregressive (the baseline)


class SettingError(DFlashError):
    """A runtime setting's value refused: `name` the field, `problem` what is wrong (ends with the value)."""

    def __init__(self, name: str, problem: str):
        self.name, self.problem = name, problem
        super().__init__(f"{flag(name)} {problem}")


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def draft_len_kind(setting: str) -> str:
    """What a --draft-len value names: 'auto', 'fixed' (a number of drafts) or 'schedule' (a draft_len_schedule
    file); anything else is refused."""
    setting = str(setting).strip()
    if setting == AUTO:
        return AUTO
    if setting.isdigit():
        return "fixed"
    if Path(setting).is_file():
        return "schedule"
    raise SettingError("draft_len", f"must be 'auto', a number of draft tokens, or a draft_len_schedule file; "
                                    f"got {setting!r}")


@dataclass(frozen=True)
class RuntimeConfig:
    decoding: str = "dflash"  # or "plain": the target alone (DECODINGS)
    step_mode: str = AUTO  # eager | compile | cuda-graphs | auto: cuda-graphs on CUDA, eager on a CPU
    draft_len: str = AUTO  # auto | N | a draft_len_schedule file (engine/draft_len.py)
    threads: int | None = None  # torch threads per rank (None: utils/threads.default_threads)
    prefix_caching: bool = True  # reuse the KV blocks of prompt prefixes earlier requests computed
    max_num_tokens: int | None = None  # longer prompts are prefilled in chunks of this many tokens (None: whole)
    kv_cache_gib: float | None = None  # the paged KV pool, GiB (None: the runner's default)

    def __post_init__(self):
        if self.decoding not in DECODINGS:
            raise SettingError("decoding", f"must be one of {', '.join(DECODINGS)}, got {self.decoding!r}")
        if self.step_mode != AUTO and self.step_mode not in STEP_MODES:
            raise SettingError("step_mode", f"must be one of {', '.join((AUTO, *STEP_MODES))}, got "
                                            f"{self.step_mode!r}")
        draft_len_kind(self.draft_len)
        for name in ("threads", "max_num_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise SettingError(name, f"must be at least 1, got {value}")
        if not isinstance(self.prefix_caching, bool):
            raise SettingError("prefix_caching", f"must be true or false, got {self.prefix_caching!r}")
        if self.kv_cache_gib is not None and not self.kv_cache_gib > 0:
            raise SettingError("kv_cache_gib", f"must be positive, got {self.kv_cache_gib}")

    @property
    def kv_cache_bytes(self) -> int | None:
        return None if self.kv_cache_gib is None else int(self.kv_cache_gib * 2**30)

    @classmethod
    def from_flags(cls, args) -> RuntimeConfig:
        """From an argparse namespace: each field from its flag; --no-prefix-caching turns prefix caching off; a
        field the tool has no flag for keeps its default."""
        values = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}
        if hasattr(args, "no_prefix_caching"):
            values["prefix_caching"] = not args.no_prefix_caching
        return cls(**values)

    def triton_params(self) -> dict[str, str]:
        """The Triton model parameters (strings) that say this config; None fields are left out."""
        params = {f.name: getattr(self, f.name) for f in fields(self)}
        params["prefix_caching"] = int(self.prefix_caching)
        return {name: str(value) for name, value in params.items() if value is not None}

    @classmethod
    def from_triton_params(cls, params: dict[str, str]) -> RuntimeConfig:
        """From a Triton model's parameters (config.pbtxt, every value a string); absent ones keep their defaults.
        An error names the parameter and its value."""
        values = {"prefix_caching": param(params, "prefix_caching", bool, True)}
        values.update({name: param(params, name, kind) for name, kind in (
            ("decoding", str), ("step_mode", str), ("draft_len", str), ("threads", int),
            ("max_num_tokens", int), ("kv_cache_gib", float))})
        try:
            return cls(**{name: value for name, value in values.items() if value is not None})
        except SettingError as exc:
            raise DFlashError(f"model parameter '{exc.name}' {exc.problem}") from None


def param(params: dict[str, str], name: str, kind: type, default=None):
    """One Triton model parameter as `kind` (bool: "1" or "0"), or `default` when absent."""
    if name not in params:
        return default
    text = params[name]
    if kind is bool:
        if text in ("0", "1"):
            return text == "1"
    else:
        try:
            return kind(text)
        except ValueError:
            pass
    words = {bool: "1 or 0", int: "an integer", float: "a number"}
    raise DFlashError(f"model parameter '{name}' must be {words[kind]}, got {text!r}")
