"""Choosing the draft length of every step: a measured step-cost model, live acceptance statistics,
and the policy that weighs them (`policy.py`); `tune.py` turns measured sweeps into a TensorRT-LLM
`draft_len_schedule`."""
