"""MXFP4 (OCP microscaling FP4) weights, as gpt-oss ships its experts, dequantised at load.

Layout (transformers 5.23 integrations/mxfp4.py `_convert_moe_packed_tensors`, the format of
openai/gpt-oss-20b/120b): `<name>_blocks` uint8 [..., G, 16] packs 32 FP4 (E2M1) values per group,
the low nibble first; `<name>_scales` uint8 [..., G] holds one power-of-two exponent per group
with bias 127. The dequantised tensor is [..., G * 32] with value = FP4 * 2^(scale - 127).
"""

from __future__ import annotations

import torch

# E2M1 code -> value; bit 3 is the sign.
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def dequantize(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16,
               chunk_groups: int = 1 << 20) -> torch.Tensor:
    """blocks: uint8 [..., G, B]; scales: uint8 [..., G] -> [..., G * 2B] in `dtype`.

    Exact in bfloat16 and float32 (an FP4 value has a 2-bit mantissa; the scale only moves the
    exponent). Works through `chunk_groups` groups at a time to bound the temporaries.
    """
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8 or blocks.shape[:-1] != scales.shape:
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} {blocks.dtype} and scales {tuple(scales.shape)} "
                         f"{scales.dtype} do not match (expected uint8 [..., G, B] and [..., G])")
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32, device=blocks.device)
    width = blocks.shape[-1]
    flat_blocks, flat_scales = blocks.reshape(-1, width), scales.reshape(-1)
    out = torch.empty(flat_blocks.shape[0], 2 * width, dtype=dtype, device=blocks.device)
    for start in range(0, flat_blocks.shape[0], chunk_groups):
        part = flat_blocks[start:start + chunk_groups]
        values = torch.stack((lut[(part & 0x0F).int()], lut[(part >> 4).int()]), dim=-1).flatten(-2)  # low nibble first
        exponents = flat_scales[start:start + chunk_groups].to(torch.int32)[:, None] - 127
        out[start:start + chunk_groups] = torch.ldexp(values, exponents)
    return out.view(*blocks.shape[:-2], -1)
