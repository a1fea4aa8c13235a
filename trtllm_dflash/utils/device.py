"""The name of the device a measurement ran on, as results files record it."""

from __future__ import annotations

from pathlib import Path

import torch


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"cpu: {line.split(':', 1)[1].strip()}"
    except OSError:
        pass
    import platform

    return f"cpu: {platform.processor() or platform.machine()}"
