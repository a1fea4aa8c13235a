"""`python -m trtllm_dflash.serve.openai`: the frontend process dflash-serve starts beside tritonserver."""

from __future__ import annotations

import argparse
import os
import sys

from ...utils.cli import run_cli

PROG = "dflash-serve"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"{PROG} (OpenAI frontend)", description="OpenAI-compatible API in front of "
                                "a running tritonserver that serves a dflash torch engine.")
    p.add_argument("--engine", required=True, help="the engine directory (tokenizer, limits)")
    p.add_argument("--triton-grpc", required=True, help="host:port of tritonserver's gRPC endpoint")
    p.add_argument("--model", required=True, help="the Triton model name (served under the same name)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--chat-template", help="Jinja chat template file (default: the tokenizer's)")
    p.add_argument("--max-request-bytes", type=int, help="larger request bodies are refused with 413")
    return p


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        from .auth import API_KEY_ENV
        from .limits import DEFAULT_MAX_REQUEST_BYTES
        from .server import FrontendSettings, run_frontend

        args = parser().parse_args(argv)
        key = os.environ.get(API_KEY_ENV) or None  # the environment, never a flag: `ps` shows command lines
        return run_frontend(FrontendSettings(args.engine, args.triton_grpc, args.model, args.host, args.port,
                                             args.chat_template, args.max_request_bytes or DEFAULT_MAX_REQUEST_BYTES,
                                             key))

    return run_cli(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
