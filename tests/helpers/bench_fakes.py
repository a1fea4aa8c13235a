"""Stand-ins for dflash-bench's endpoints (aiohttp on loopback), a byte tokenizer, and reading its JSONL output."""

import asyncio
import json
import threading

from trtllm_dflash.engine.loader import free_port


class LoopbackServer:
    """An aiohttp application on 127.0.0.1 in a thread of its own; subclasses add routes."""

    def __init__(self):
        self.requests: list[tuple[str, dict]] = []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def routes(self, app) -> None:
        raise NotImplementedError

    def __enter__(self):
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.thread = threading.Thread(target=self.serve, args=(started,), daemon=True)
        self.thread.start()
        assert started.wait(10)
        return self

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def serve(self, started):
        from aiohttp import web

        asyncio.set_event_loop(self.loop)
        app = web.Application()
        self.routes(app)
        self.runner = web.AppRunner(app, shutdown_timeout=0.1)  # stopping drops streams in flight
        self.loop.run_until_complete(self.runner.setup())
        self.loop.run_until_complete(web.TCPSite(self.runner, "127.0.0.1", self.port).start())
        started.set()
        self.loop.run_forever()


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def save(tok, path, chat_template=None):
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    if chat_template:
        fast.chat_template = chat_template
    fast.save_pretrained(str(path))
    return path


def byte_tokenizer(path, chat_template=None):
    """One token per byte, no merges (like the first built-in pair's)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    return save(tok, path, chat_template)
