"""Build time and peak memory of dflash-build on the built-in pair, per backend/TP/quantization.

Each build runs in a fresh process that reports its own wall time and peak RSS. Writes
benchmarks/results/build_tiny_pair.json and prints a table last.
Run: python benchmarks/build_tiny_pair.py
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OUT = Path(__file__).parent / "results" / "build_tiny_pair.json"
CASES = [
    ("torch tp1 fp32", ["--dtype", "float32"]),
    ("torch tp2 fp32", ["--dtype", "float32", "--tp", "2"]),
    ("torch tp2 bf16", ["--tp", "2"]),
    ("trtllm tp2", ["--backend", "trtllm", "--tp", "2"]),
    ("trtllm fp8", ["--backend", "trtllm", "--quant", "fp8"]),
    ("trtllm nvfp4", ["--backend", "trtllm", "--quant", "nvfp4"]),
]
CHILD = """
import json, resource, sys, time
from trtllm_dflash.cli.build import main
t0 = time.perf_counter()
code = main(sys.argv[1:])
print(json.dumps({"code": code, "seconds": time.perf_counter() - t0,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def main() -> None:
    from trtllm_dflash.builtin import builtin_pair

    target, drafter = builtin_pair()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, flags in CASES:
            out = Path(tmp) / name.replace(" ", "-")
            args = ["--target", str(target), "--drafter", str(drafter), "--output", str(out), *flags]
            proc = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, check=True)
            record = json.loads(proc.stdout.strip().splitlines()[-1])
            size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
            rows.append({"case": name, "flags": flags, **record, "engine_mib": size / 2**20})
    result = {"command": "python " + " ".join(sys.argv), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": {"platform": platform.platform(), "python": platform.python_version()},
              "pair": str(target.parent), "rows": rows}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'case':<16} {'seconds':>8} {'peak RSS MiB':>13} {'engine MiB':>11}")
    for r in rows:
        print(f"{r['case']:<16} {r['seconds']:>8.2f} {r['peak_rss_mib']:>13.0f} {r['engine_mib']:>11.2f}")
    print(f"written: {OUT}")


if __name__ == "__main__":
    main()
