"""Why a `trtllm` engine cannot hold a DFlash2 drafter yet, in one line.

The evidence (read 2026-12):
- TensorRT-LLM serves DFlash2 from its main branch: PR #18155 "[TRTLLM-15788][feat] Add dflash 2 support" (merged
  2026-09) keys it off the drafter checkpoint (`tensorrt_llm/_torch/models/modeling_dflash.py`
  `_is_dflash2_architecture`, `dflash_config.conv_*` / `selector_*`), not off an option; `DFlashDecodingConfig` gains
  no DFlash2 field in the releases whose field tables this tool has (tables/; 1.4.0rc1's `spec_dec_variant` is an
  undocumented int the code does not read for DFlash2). No release note naming #18155 was found.
- PR #19159 "[TRTLLM-16403][chore] Add more dflash 2 tests" rejects the TRTLLM attention backend for such a drafter:
  it cannot run the non-causal sliding window (`validate_block_attention_windows`).
So an engine would name a release that reads the drafter as a plain DFlash one and drafts with other math.
"""

from __future__ import annotations

from ...config.model import DrafterConfig
from ...utils.errors import DFlashError
from .tables import known_versions


def refuse_dflash2(drafter: DrafterConfig) -> None:
    if drafter.method != "dflash2":
        return
    raise DFlashError(
        "the drafter is DFlash2 (convolutions and a candidate selector): no TensorRT-LLM release is known to serve it "
        f"(DFlash2 is on TensorRT-LLM's main branch since PR #18155; the newest release table here, "
        f"{known_versions()[-1]}, reads DFlash only; PR #19159: its TRTLLM attention backend cannot run the "
        "non-causal sliding window): build it with --backend torch")
