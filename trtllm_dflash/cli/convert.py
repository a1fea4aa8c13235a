"""dflash-convert: rewrite a DFlash drafter in z-lab's or the `speculators` library's checkpoint format."""

from __future__ import annotations

import argparse
import sys

from ..utils.cli import run_cli
from .common import model_path

PROG = "dflash-convert"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Convert a DFlash drafter between z-lab's layout "
                                "(DFlashDraftModel + dflash_config; what TensorRT-LLM and SGLang read) and the "
                                "speculators library's (what vLLM reads). Tensors are copied bit for bit.")
    p.add_argument("drafter", help="drafter directory (either format), hub id, or 'builtin'")
    p.add_argument("output", help="directory to create")
    p.add_argument("--to", required=True, help="zlab | speculators")
    p.add_argument("--verifier", help="the target the drafter was made for (directory or hub id); required by "
                   "--to speculators, whose config records it")
    p.add_argument("--force", action="store_true", help="replace an existing output directory")
    return p


def run(argv: list[str] | None) -> int:
    from ..checkpoint.drafter import Verifier, convert_drafter

    args = parser().parse_args(argv)
    verifier = Verifier.of(model_path(args.verifier, "target")) if args.verifier else None
    out = convert_drafter(model_path(args.drafter, "drafter"), args.output, args.to, verifier, args.force)
    print(f"drafter written to {out} ({args.to} format)")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli(PROG, lambda: run(argv))


if __name__ == "__main__":
    sys.exit(main())
