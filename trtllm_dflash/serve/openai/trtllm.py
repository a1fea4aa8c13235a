"""The OpenAI API of a `trtllm` engine is TensorRT-LLM's own `trtllm-serve`: the command that serves it
under the same model name a torch engine's frontend uses, so one client works against both.

Facts read from NVIDIA/TensorRT-LLM (the repository is too large to fetch here; the stored files):
- `tensorrt_llm/commands/serve.py` @00209af149e7, the `serve` click command: positional MODEL (a Hugging
  Face checkpoint directory), `--host` (default localhost), `--port` (default 8000), `--backend`
  (pytorch, the default), `--tp_size` (alias of `--tensor_parallel_size`), `--config` (alias
  `--extra_llm_api_options`: a YAML whose keys override the flags), `--chat_template` (a file path or
  a one-line template);
- `tensorrt_llm/serve/openai_server.py` @00057725d9a6, `OpenAIServer.__init__`: when MODEL is an existing
  directory the served model id is the directory's name (`Path(model).name`), hence a link named after
  the model that points at the engine's target checkpoint. (`--served_model_name` is newer than
  serve.py @00209af149e7, so it is not relied on.)
"""

from __future__ import annotations

import os
from pathlib import Path

from ...utils.errors import DFlashError

LINKS = ".dflash-openai"  # beside the model repository: Triton must not see the link as a model


def model_link(engine_dir: Path, model_name: str, repo: Path) -> Path:
    """<repo's parent>/.dflash-openai/<model_name> -> <engine>/target (replaced if it points elsewhere)."""
    link = Path(repo).parent / LINKS / model_name
    target = (Path(engine_dir) / "target").absolute()
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() and Path(os.readlink(link)) == target:
        return link
    if link.is_symlink():
        link.unlink()
    elif link.exists():
        raise DFlashError(f"{link} exists and is not a link this tool made: remove it")
    link.symlink_to(target, target_is_directory=True)
    return link


def trtllm_serve_command(link: Path, options: Path, tp_size: int, host: str, port: int,
                         chat_template: str | None = None) -> list[str]:
    command = ["trtllm-serve", str(link), "--backend", "pytorch", "--tp_size", str(tp_size), "--config",
               str(options), "--host", host, "--port", str(port)]
    return command + (["--chat_template", str(Path(chat_template).absolute())] if chat_template else [])
