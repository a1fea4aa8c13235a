#!/bin/bash
# As run on 2026-11-26 (20:47-20:51 UTC). /tmp/ph/head held `git archive 1bb4b84 trtllm_dflash plugins`; "head" was
# this tree before its commit (kept drafting choices); its files were renamed kept_N.json afterwards.
# run from /tmp so that neither tree's package shadows the other through the working directory
cd /tmp
out=/work/main/benchmarks/results/policy_host_time_kept
for i in 1 2 3; do
  for v in 1bb4b84 head; do
    if [ $v = 1bb4b84 ]; then pp=/tmp/ph/head; else pp=/work/main; fi
    PYTHONPATH=$pp /work/main/.venv/bin/python /work/main/benchmarks/policy_host_time.py --repeats 2 --points short:1,short:16 --output $out/${v}_$i.json > /tmp/ph/pht_ab_${v}_$i.log 2>&1
    echo "$v $i rc=$? $(date +%T)"
  done
done
