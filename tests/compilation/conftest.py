import pytest


@pytest.fixture(scope="module")
def prompts(pair):
    """Held-out texts of the shipped pair, cut to 6, 13, 20, 27 and 34 tokens."""
    from trtllm_dflash.engine.pipeline import load_pipeline
    from trtllm_dflash.pairs import held_out_texts

    tokenizer = load_pipeline(pair[0]).tokenizer
    return [tokenizer(t, add_special_tokens=False)["input_ids"][: 6 + 7 * i] for i, t in enumerate(held_out_texts(5))]
