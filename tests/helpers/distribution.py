"""Exact output distributions of a tiny target by enumeration, and Pearson's test of sampled outputs against them."""

import itertools
import math

import torch
from trtllm_dflash.engine.request import Request

from trtllm_dflash.sample.sampling import SamplingParams

V, PROMPT, N_NEW, SAMPLES = 6, (1, 4, 2, 0, 3), 3, 4000


def exact_distribution(hf, params: SamplingParams, n_new: int = N_NEW) -> dict[tuple, float]:
    """P(x1..xn | prompt) by enumeration, with transformers' own logits warpers."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    warp = LogitsProcessorList([TemperatureLogitsWarper(params.temperature)])
    if params.top_k:
        warp.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1:
        warp.append(TopPLogitsWarper(params.top_p))
    probs: dict[tuple, float] = {}
    with torch.no_grad():
        for seq in itertools.product(range(V), repeat=n_new):
            p = 1.0
            for i in range(n_new):
                ids = torch.tensor([PROMPT + seq[:i]])
                p *= float(torch.softmax(warp(ids, hf(ids).logits[:, -1]), -1)[0, seq[i]])
            probs[seq] = p
    return probs


def chi_square_rejects(counts: dict[tuple, int], probs: dict[tuple, float], n: int) -> tuple[bool, float, float]:
    """Pearson's test at alpha = 1e-3; cells expecting fewer than 5 are pooled."""
    stat, pool_obs, pool_exp, cells = 0.0, 0, 0.0, 0
    for seq, p in probs.items():
        exp, obs = n * p, counts.get(seq, 0)
        if exp < 5:
            pool_obs, pool_exp = pool_obs + obs, pool_exp + exp
            continue
        stat, cells = stat + (obs - exp) ** 2 / exp, cells + 1
    if pool_exp > 0:
        stat, cells = stat + (pool_obs - pool_exp) ** 2 / pool_exp, cells + 1
    df = cells - 1
    z = 3.0902  # upper 1e-3 normal quantile; Wilson-Hilferty approximation of the chi-square quantile
    critical = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return stat > critical, stat, critical


def sample(gen, params: SamplingParams, n_new: int = N_NEW, samples: int = SAMPLES):
    requests = [Request(PROMPT, n_new, SamplingParams(params.temperature, params.top_p, params.top_k, seed),
                        ignore_eos=True) for seed in range(samples)]
    results = gen.generate(requests)
    counts: dict[tuple, int] = {}
    for r in results:
        counts[tuple(r.output_ids)] = counts.get(tuple(r.output_ids), 0) + 1
    return counts, results
