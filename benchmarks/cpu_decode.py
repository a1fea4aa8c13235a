"""The fast-step goals on the CPU, as ratios of runs made back to back (the machine is shared and noisy).

    python benchmarks/cpu_decode.py [--repeats 5] [--prompts 6] [--max-new-tokens 128] [--threads 1]

Built-in pair (trtllm_dflash/pairs/stdlib), held-out prompts, fixed output length (EOS ignored), one
torch thread unless told otherwise. Every case is a ratio A / B of two runs over the same prompts,
made in alternating order (AB, BA, ...) --repeats times; the JSON keeps every ratio and its
min / median / max, the goal, and whether the median meets it. Cases:
  dflash_vs_plain     batch 1, greedy: output tokens/s of DFlash / plain decoding        goal >= 2.2
  plain_vs_hf         batch 1, greedy: plain tokens/s / transformers `generate`          goal >= 1.3
  sampling_overhead   batch 1, plain: per-token decode time at T=1 / greedy, minus 1     goal <= 0.05
  ttft                batch 1: DFlash median TTFT / plain median TTFT                    goal <= 2.0
  plain_vs_hf_b8/b16  batch 8 / 16, greedy: plain tokens/s / transformers `generate`     goal >= 1.2
Batched cases use prompts cut to one length, so transformers needs no padding. Tokens/s counts
output tokens over the whole call (prefill included, for both sides). Outputs are checked: plain
and DFlash identical, plain and transformers identical. Writes benchmarks/results/cpu_decode.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

OUT = Path(__file__).parent / "results" / "cpu_decode.json"
GOALS = {"dflash_vs_plain": (">=", 2.2), "plain_vs_hf": (">=", 1.3), "sampling_overhead": ("<=", 0.05),
         "ttft": ("<=", 2.0), "plain_vs_hf_b8": (">=", 1.2), "plain_vs_hf_b16": (">=", 1.2)}


def load(threads: int):
    from transformers import AutoModelForCausalLM
    from trtllm_dflash.engine.pipeline import load_pipeline

    from trtllm_dflash.pairs import stdlib_pair

    torch.set_num_threads(threads)
    target, drafter = stdlib_pair()
    hf = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    return load_pipeline(target, drafter), load_pipeline(target), hf


def prompts(tokenizer, count: int, length: int | None = None) -> list[tuple[int, ...]]:
    from trtllm_dflash.pairs import held_out_texts

    ids = [tuple(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in held_out_texts(count)]
    if length is None:
        return ids
    if min(map(len, ids)) < length:
        raise SystemExit(f"cpu_decode: a held-out prompt is shorter than {length} tokens")
    return [p[:length] for p in ids]


def ours(generator, prompt_ids, new_tokens: int, batch: int, sampling=None):
    """-> (seconds, output ids, per-request results), requests run `batch` at a time."""
    from trtllm_dflash.engine.request import Request

    from trtllm_dflash.sample.sampling import SamplingParams

    requests = [Request(p, new_tokens, sampling or SamplingParams(), ignore_eos=True) for p in prompt_ids]
    t0 = time.perf_counter()
    results = [r for i in range(0, len(requests), batch) for r in generator.generate(requests[i:i + batch])]
    return time.perf_counter() - t0, [r.output_ids for r in results], results


@torch.inference_mode()
def transformers_generate(hf, prompt_ids, new_tokens: int, batch: int):
    t0 = time.perf_counter()
    outputs = []
    for i in range(0, len(prompt_ids), batch):
        ids = torch.tensor(prompt_ids[i:i + batch])
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        outputs += out[:, ids.shape[1]:].tolist()
    return time.perf_counter() - t0, outputs


def interleaved(run_a, run_b, repeats: int) -> tuple[list, list]:
    """-> results of A and of B, one each per repeat, alternating which goes first."""
    a, b = [], []
    for r in range(repeats):
        if r % 2:
            b.append(run_b())
            a.append(run_a())
        else:
            a.append(run_a())
            b.append(run_b())
    return a, b


def summary(name: str, ratios: list[float], **extra) -> dict:
    op, goal = GOALS[name]
    median = statistics.median(ratios)
    met = median >= goal if op == ">=" else median <= goal
    return {"ratios": ratios, "min": min(ratios), "median": median, "max": max(ratios), "goal": f"{op} {goal}",
            "met": met, **extra}


def decode_per_token(results) -> float:
    """Seconds per output token after the first, summed over requests."""
    return sum(r.finish_s - r.first_token_s for r in results) / sum(len(r.output_ids) - 1 for r in results)


def run_cases(spec, plain, hf, args) -> dict:
    from trtllm_dflash.sample.sampling import SamplingParams

    n, reps, one = args.max_new_tokens, args.repeats, prompts(spec.tokenizer, args.prompts)
    for g in (spec.generator, plain.generator):  # warm-up: first-call costs out of every measurement
        ours(g, one[:1], 8, 1)
    transformers_generate(hf, [one[0]], 8, 1)
    cases = {}
    a, b = interleaved(lambda: ours(spec.generator, one, n, 1), lambda: ours(plain.generator, one, n, 1), reps)
    identical = all(x[1] == y[1] for x, y in zip(a, b))
    cases["dflash_vs_plain"] = summary("dflash_vs_plain", [y[0] / x[0] for x, y in zip(a, b)], identical=identical)
    ttft = [statistics.median(r.ttft_s for r in x[2]) / statistics.median(r.ttft_s for r in y[2]) for x, y in zip(a, b)]
    cases["ttft"] = summary("ttft", ttft)
    a, b = interleaved(lambda: ours(plain.generator, one, n, 1), lambda: transformers_generate(hf, one, n, 1), reps)
    cases["plain_vs_hf"] = summary("plain_vs_hf", [y[0] / x[0] for x, y in zip(a, b)],
                                   identical=all(x[1] == y[1] for x, y in zip(a, b)))
    sampled = SamplingParams(temperature=1.0, seed=0)
    a, b = interleaved(lambda: ours(plain.generator, one, n, 1, sampled), lambda: ours(plain.generator, one, n, 1), reps)
    cases["sampling_overhead"] = summary("sampling_overhead",
                                         [decode_per_token(x[2]) / decode_per_token(y[2]) - 1 for x, y in zip(a, b)])
    for batch in (8, 16):
        same = prompts(spec.tokenizer, batch, args.batch_prompt_tokens)
        a, b = interleaved(lambda: ours(plain.generator, same, n, batch),
                           lambda: transformers_generate(hf, same, n, batch), reps)
        cases[f"plain_vs_hf_b{batch}"] = summary(f"plain_vs_hf_b{batch}", [y[0] / x[0] for x, y in zip(a, b)],
                                                 identical=all(x[1] == y[1] for x, y in zip(a, b)))
    return cases


def run_record(args, started: float, load_before) -> dict:
    """What a CPU run records besides its cases: command, date, wall time, machine and load, settings."""
    from trtllm_dflash import __version__

    return {
        "command": "python " + " ".join(sys.argv),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "wall_s": time.time() - started,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch_threads": args.threads,
                    "torch": torch.__version__, "python": platform.python_version(),
                    "load_average_before": load_before, "load_average_after": os.getloadavg()},
        "trtllm_dflash": __version__, "pair": "trtllm_dflash/pairs/stdlib",
        "settings": vars(args) | {"output": str(args.output)},
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--prompts", type=int, default=6, help="batch-1 prompts per run")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch-prompt-tokens", type=int, default=32, help="prompt length in the batched cases")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--output", type=Path, default=OUT)
    args = p.parse_args()
    load_before = os.getloadavg()
    spec, plain, hf = load(args.threads)
    started = time.time()
    cases = run_cases(spec, plain, hf, args)
    record = {**run_record(args, started, load_before), "cases": cases}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=2) + "\n")
    print(f"{'case':<18} {'min':>7} {'median':>7} {'max':>7}  goal      met")
    for name, c in cases.items():
        print(f"{name:<18} {c['min']:>7.3f} {c['median']:>7.3f} {c['max']:>7.3f}  {c['goal']:<8}  {c['met']}")
    print(f"written: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
