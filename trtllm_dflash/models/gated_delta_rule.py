"""The gated delta rule: the recurrence of Gated DeltaNet linear attention (Yang et al., 2024).

Per value head, with a state S [D_k, D_v] and per token t a decay g_t (log space, <= 0), a write
strength beta_t in (0, 1), a key k_t (L2-normalised), a value v_t and a query q_t:

    S <- exp(g_t) * S
    S <- S + k_t (beta_t * (v_t - S^T k_t))^T          (the delta rule: write the correction only)
    o_t = S^T q_t / sqrt(D_k)

`recurrent` runs it token by token (decode); `chunked` runs it in chunks of C tokens with the
UT transform (prefill and verify), which is the same map up to float rounding. A token with
g = 0 and beta = 0 leaves S exactly as it was: that is how a prefix of a pass is committed
(`keep`), for right-padded prompts and for the accepted part of a verified block.

On CUDA, flash-linear-attention's Triton kernels run it where the package is installed
(`pip install flash-linear-attention`, imported lazily); elsewhere this exact PyTorch code does.
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F

CHUNK = 64


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim, as flash-linear-attention computes it."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def gated_delta_rule(q: torch.Tensor | None, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     state: torch.Tensor, keep: torch.Tensor | None = None) -> tuple[torch.Tensor | None, torch.Tensor]:
    """q, k: [B, T, H, D_k] (not yet normalised; H = value heads); v: [B, T, H, D_v]; g, beta: [B, T, H];
    state: [B, H, D_k, D_v] fp32, read only. keep: [B] tokens of each row whose updates the returned
    state holds (None: all T). -> outputs [B, T, H, D_v] fp32 (None when q is None), final state fp32.
    """
    if keep is not None:
        live = (torch.arange(k.shape[1], device=k.device)[None, :] < keep[:, None])[..., None]  # [B, T, 1]
        g, beta = g * live, beta * live
    if k.is_cuda and k.dtype != torch.float32 and _fla_available():
        return _fla(q, k, v, g.float(), beta.float(), state)
    k = l2norm(k.float())
    q = None if q is None else l2norm(q.float()) * q.shape[-1] ** -0.5
    if k.shape[1] == 1:
        return recurrent(q, k, v.float(), g.float(), beta.float(), state)
    return chunked(q, k, v.float(), g.float(), beta.float(), state)


def recurrent(q, k, v, g, beta, state):
    """Token by token; shapes as `gated_delta_rule`, q and k normalised, q scaled."""
    s = state.float().clone()
    out = None if q is None else v.new_empty(v.shape)
    for t in range(k.shape[1]):
        s = s * g[:, t].exp()[..., None, None]
        delta = (v[:, t] - torch.einsum("bhkv,bhk->bhv", s, k[:, t])) * beta[:, t, :, None]
        s = s + k[:, t, :, :, None] * delta[:, :, None, :]
        if out is not None:
            out[:, t] = torch.einsum("bhkv,bhk->bhv", s, q[:, t])
    return out, s


def chunked(q, k, v, g, beta, state, chunk: int = CHUNK):
    """Chunks of `chunk` tokens: inside a chunk the T sequential rank-1 updates become triangular solves and
    matmuls (the UT transform); across chunks the state is carried. Shapes as `gated_delta_rule`."""
    b, t, h, _ = k.shape
    chunk = min(chunk, t)
    pad = (-t) % chunk  # padded tokens have g = beta = 0: no effect on the state
    # -> [B, H, N, C, D] (N chunks of C tokens) and [B, H, N, C] for g, beta
    split = lambda x: F.pad(x.transpose(1, 2), (0, 0, 0, pad)).unflatten(2, (-1, chunk))  # noqa: E731
    k, v = split(k), split(v)
    q = None if q is None else split(q)
    g, beta = (F.pad(x.transpose(1, 2), (0, pad)).unflatten(2, (-1, chunk)) for x in (g, beta))
    decay = g.cumsum(-1)  # log of the decay from the chunk's start through each token
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=k.device).tril()
    # pairwise[i, j] = exp(decay_i - decay_j) for j <= i, else 0
    pairwise = (decay[..., :, None] - decay[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    k_beta = k * beta[..., None]
    # (I + strictly_lower(A)) X = Y, with A = (beta k) k^T decayed; unitriangular ignores A's diagonal
    system = (k_beta @ k.transpose(-1, -2)) * pairwise
    u = torch.linalg.solve_triangular(system, v * beta[..., None], upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, k_beta * decay.exp()[..., None], upper=False, unitriangular=True)
    tail = decay[..., -1:]  # [B, H, N, 1] the whole chunk's decay
    k_to_end = k * (tail - decay).exp()[..., None]
    s = state.float()
    out = None if q is None else torch.empty_like(v)
    if q is not None:
        intra = (q @ k.transpose(-1, -2)) * pairwise
        q_decayed = q * decay.exp()[..., None]
    for c in range(k.shape[2]):
        v_new = u[:, :, c] - w[:, :, c] @ s  # [B, H, C, D_v]: what each token writes, given the state
        if out is not None:
            out[:, :, c] = q_decayed[:, :, c] @ s + intra[:, :, c] @ v_new
        s = s * tail[:, :, c, :, None].exp() + k_to_end[:, :, c].transpose(-1, -2) @ v_new
    if out is not None:
        out = out.flatten(2, 3)[:, :, :t].transpose(1, 2)
    return out, s


def _fla_available() -> bool:
    return importlib.util.find_spec("fla") is not None


def _fla(q, k, v, g, beta, state):
    """flash-linear-attention's Triton kernels (fla.ops.gated_delta_rule, [B, T, H, D] layout, half
    precision q/k/v, L2 norm and 1/sqrt(D_k) applied in the kernel, fp32 state). Not exercised by this
    project's CPU-only CI: it runs only where CUDA and the package are present."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

    kernel = fused_recurrent_gated_delta_rule if k.shape[1] == 1 else chunk_gated_delta_rule
    out, final = kernel(k if q is None else q, k, v, g=g, beta=beta, initial_state=state.float(),
                        output_final_state=True, use_qk_l2norm_in_kernel=True)
    return (None if q is None else out.float()), final.float()
