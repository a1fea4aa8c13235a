"""Prompts for dflash-bench: random text of exact token lengths (byte-level and trained BPE tokenizers),
JSONL datasets with chat templates, and where the tokenizer comes from."""

import json
import random

import pytest
from helpers.bench_fakes import byte_tokenizer, save

from trtllm_dflash.bench.prompts import PromptSource, count_tokens, read_dataset
from trtllm_dflash.bench.tokenizer import resolve_tokenizer
from trtllm_dflash.utils.errors import DFlashError

CHAT = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")
WORDS = ["the", "model", "drafts", "a", "block", "of", "tokens", "and", "target", "verifies", "them", "in", "one",
         "pass", "accepted", "prefix", "is", "kept", "speculative", "decoding", "serving", "throughput", "per", "GPU"]


def bpe_tokenizer(path, chat_template=None):
    """A GPT-2-style byte-level BPE trained here: merges across joins make exact lengths non-trivial."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(0)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(30)) + rng.choice([".", "!", "?"]) for _ in range(400)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    return save(tok, path, chat_template)


@pytest.fixture(params=["bytes", "bpe"])
def tokenizer(request, tmp_path):
    make = byte_tokenizer if request.param == "bytes" else bpe_tokenizer
    return resolve_tokenizer(str(make(tmp_path / request.param, CHAT))).tokenizer


def test_random_prompts_have_exact_token_lengths_in_range(tokenizer):
    source = PromptSource(tokenizer, isl=64, isl_range=0.5, seed=1)
    prompts = [source.get(i) for i in range(24)]
    for p in prompts:
        assert 32 <= p.isl <= 64 and count_tokens(tokenizer, p.text) == p.isl, (p.isl, p.text)
    assert len({p.isl for p in prompts}) > 5 and len({p.text for p in prompts}) == 24
    again = PromptSource(tokenizer, isl=64, isl_range=0.5, seed=1)
    assert [again.get(i).text for i in (5, 0, 23)] == [prompts[i].text for i in (5, 0, 23)]  # seed and index only
    assert PromptSource(tokenizer, isl=64, isl_range=0.5, seed=2).get(0).text != prompts[0].text


def test_random_prompts_of_fixed_length(tokenizer):
    source = PromptSource(tokenizer, isl=200, isl_range=1.0, seed=0)
    assert {source.get(i).isl for i in range(5)} == {200}
    assert all(count_tokens(tokenizer, source.get(i).text) == 200 for i in range(5))


def test_dataset_prompts_and_chat_messages(tokenizer, tmp_path):
    path = tmp_path / "data.jsonl"
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is a draft block?"}]
    path.write_text(json.dumps({"prompt": "the model drafts a block", "category": "qa"}) + "\n\n"
                    + json.dumps({"messages": chat}) + "\n")
    plain, templated = read_dataset(path, tokenizer)
    assert plain.text == "the model drafts a block" and plain.messages is None and plain.category == "qa"
    assert plain.isl == count_tokens(tokenizer, plain.text) and plain.source == 1
    assert templated.text == "<|system|>be brief\n<|user|>what is a draft block?\n<|assistant|>"
    assert templated.messages == tuple(chat) and templated.source == 3
    assert templated.isl == count_tokens(tokenizer, templated.text)
    source = PromptSource(tokenizer, seed=0, dataset=[plain, templated])
    assert {source.get(i).text for i in range(4)} == {plain.text, templated.text}  # cycles, shuffled


@pytest.mark.parametrize("lines, needle", [
    (['{"prompt": "ok"}', '{"prompt": "ok"}', '{"prompt": "broken'], "data.jsonl:3: not valid JSON"),
    (['{"prompt": "ok"}', '{"text": "wrong key"}'], "data.jsonl:2: needs a non-empty 'prompt' string or a 'messages'"),
    (['["a list"]'], "data.jsonl:1: expected a JSON object, got list"),
    (['{"messages": [{"role": "user"}]}'], "data.jsonl:1: each message needs string 'role' and 'content'"),
    (['{"prompt": "x", "category": 3}'], "data.jsonl:1: 'category' must be a string"),
    ([""], "holds no prompts"),
])
def test_malformed_dataset_names_the_line(tokenizer, tmp_path, lines, needle):
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DFlashError, match=needle.replace("[", r"\[")):
        read_dataset(path, tokenizer)


def test_dataset_not_utf8_names_the_line(tokenizer, tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(DFlashError, match=r"data.jsonl:2: not UTF-8 text \(byte 0xe9 at column 16\)"):
        read_dataset(path, tokenizer)


def test_chat_messages_need_a_chat_template(tmp_path):
    tok = resolve_tokenizer(str(byte_tokenizer(tmp_path / "t"))).tokenizer
    path = tmp_path / "chat.jsonl"
    path.write_text('{"prompt": "fine"}\n{"messages": [{"role": "user", "content": "hi"}]}\n')
    with pytest.raises(DFlashError, match="chat.jsonl:2: chat 'messages' need a tokenizer with a chat template"):
        read_dataset(path, tok)


def test_tokenizer_from_an_engine_directory_records_its_manifest(tmp_path):
    from trtllm_dflash.config.manifest import Manifest, sha256_file

    engine = tmp_path / "engine"
    byte_tokenizer(engine / "tokenizer")
    Manifest("torch", {"source": "t"}, {"source": "d"}, 2, "float32", "none", 8, {"max_batch_size": 4},
             "tokenizer", "test", "0.1.0", "now").write(engine)
    found = resolve_tokenizer(str(engine))
    assert found.engine["manifest_sha256"] == sha256_file(engine / "manifest.json")
    assert found.engine["tp_size"] == 2 and found.origin.endswith("tokenizer")
    assert count_tokens(found.tokenizer, "abc") == 3


@pytest.mark.parametrize("name, needle", [
    (None, "--tokenizer is required"),
    ("{tmp}/nowhere", "--tokenizer: no such model or engine directory"),
    ("{tmp}", "has no tokenizer files"),
])
def test_tokenizer_errors(tmp_path, name, needle):
    with pytest.raises(DFlashError, match=needle):
        resolve_tokenizer(name and name.format(tmp=tmp_path))
