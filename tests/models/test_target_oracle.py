"""The project's Qwen3/Llama implementation against transformers (float32)."""

import json

import pytest
import torch
from helpers.tiny_models import make_hf_target
from trtllm_dflash.checkpoint.loader import load_target

from trtllm_dflash.models.attention import ForwardContext

ATOL = 2e-5


def prefill(model, ids, slots, cache, capture=()):
    """Prompts from position 0 into any slots."""
    n, t = ids.shape
    ctx = ForwardContext.prefill(torch.arange(t).expand(n, -1), cache, slots, torch.full((n,), t),
                                 capture_layer_ids=capture)
    hidden, feats = model(ids, ctx)
    return model.logits(hidden), feats


def cached(model, ids, starts, cache):
    """A block per row at its own start; row b is cache slot b, keys read from the cache in place."""
    positions = starts[:, None] + torch.arange(ids.shape[1])
    hidden, _ = model(ids, ForwardContext.cached(positions, cache, int(positions.max()) + 1))
    return model.logits(hidden)


def test_logits_and_every_hidden_state_match(hf_target):
    hf, path = hf_target
    target = load_target(path).model
    layers = target.config.num_hidden_layers
    ids = torch.randint(0, target.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(ids, output_hidden_states=True)
    logits, feats = prefill(target, ids, torch.arange(2), target.new_cache(2, 48), tuple(range(layers)))
    torch.testing.assert_close(logits, ref.logits, atol=ATOL, rtol=0)
    # capture id i is the output of decoder layer i == hidden_states[i + 1]
    expected = torch.cat([ref.hidden_states[i + 1] for i in range(layers)], dim=-1)
    torch.testing.assert_close(feats, expected, atol=ATOL, rtol=0)


def test_cache_rollback_and_ragged_rows_match_full_recompute(hf_target):
    """Prefill, verify a block, roll back to an accepted prefix, continue: equals a fresh full pass."""
    hf, path = hf_target
    target = load_target(path).model
    g = torch.Generator().manual_seed(1)
    seq = torch.randint(0, target.config.vocab_size, (2, 20), generator=g)
    cache = target.new_cache(2, 40, 6)
    prefill(target, seq[:, :10], torch.tensor([1, 0]), cache)  # row 0 -> slot 1, row 1 -> slot 0
    junk = torch.randint(0, target.config.vocab_size, (2, 6), generator=g)
    cached(target, junk.flip(0), torch.tensor([10, 10]), cache)  # a rejected block, in slot order
    # row 0 accepted 2 junk tokens, row 1 none: both continue from their own committed length
    cont = torch.stack([torch.cat([junk[0, :2], seq[0, 12:16]]), seq[1, 10:16]])[:, -4:]
    logits = cached(target, cont.flip(0), torch.tensor([10, 12]), cache).flip(0)
    full0 = torch.cat([seq[0, :10], junk[0, :2], cont[0]])
    full1 = torch.cat([seq[1, :10], cont[1]])
    with torch.no_grad():
        ref0 = hf(full0[None]).logits[0, -4:]
        ref1 = hf(full1[None]).logits[0, -4:]
    torch.testing.assert_close(logits[0], ref0, atol=ATOL, rtol=0)
    torch.testing.assert_close(logits[1], ref1, atol=ATOL, rtol=0)


def test_tied_embeddings_and_sharded_checkpoint(tmp_path):
    hf = make_hf_target(tmp_path / "t", "qwen3", seed=3, tie_word_embeddings=True)
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    ids = torch.arange(2, 30)[None]
    with torch.no_grad():
        ref = hf(ids).logits
    for d in ("t", "sharded"):
        target = load_target(tmp_path / d).model
        assert target.lm_head.weight is target.model.embed_tokens.weight
        logits, _ = prefill(target, ids, torch.tensor([0]), target.new_cache(1, 32))
        torch.testing.assert_close(logits, ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_loads_and_tracks_float32(hf_target, dtype):
    hf, path = hf_target
    target = load_target(path, dtype=dtype).model
    assert target.lm_head.weight.dtype == dtype
    ids = torch.arange(3, 23)[None]
    logits, _ = prefill(target, ids, torch.tensor([0]), target.new_cache(1, 24))
    with torch.no_grad():
        ref = hf(ids).logits
    assert (logits - ref).abs().max() < 0.15 * ref.abs().max()
