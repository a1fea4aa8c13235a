"""Record what a decode step would sync or copy on a GPU, on the CPU: tensors built from host data and reads of
device values (on CUDA each is a blocking copy or a host sync)."""

import torch

READS = ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")
BUILDS = ("tensor", "as_tensor", "from_numpy")


def record_host_traffic(monkeypatch) -> list[str]:
    """From now until monkeypatch.undo(): the names of such calls, in order."""
    calls = []
    for name in READS:
        method = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name,
                            lambda *a, _name=name, _method=method, **k: calls.append(_name) or _method(*a, **k))
    for name in BUILDS:
        fn = getattr(torch, name)
        monkeypatch.setattr(torch, name, lambda *a, _name=name, _fn=fn, **k: calls.append(_name) or _fn(*a, **k))
    return calls


def host_traffic_of_steps(gen, draft_lens, monkeypatch) -> list[str]:
    """Run one step of `gen` per draft length in `draft_lens` (FixedDraftLen) -> the host traffic they made."""
    from trtllm_dflash.draft_length.policy import FixedDraftLen

    calls = record_host_traffic(monkeypatch)
    for k in draft_lens:
        gen.policy = FixedDraftLen(k)
        gen.step()
    monkeypatch.undo()
    return calls
