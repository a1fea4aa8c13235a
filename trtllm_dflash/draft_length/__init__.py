"""Choosing the draft length of every step: live step times (`step_times.py`) and acceptance
(`acceptance.py`) weighed by the policy (`policy.py`); `schedule.py` reads and writes TensorRT-LLM's
`draft_len_schedule`, and `cost.py` the stored step-cost model that `dflash-build calibrate` measures."""
