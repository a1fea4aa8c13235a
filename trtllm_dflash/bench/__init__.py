"""dflash-bench: serving benchmarks by the field's definitions (shared/reference/benchmarking.md).

spec (SweepSpec, ReportSpec, presets) -> sweep.run_sweep: per point, load.LoadRunner drives a client
(clients registry: triton_client, openai_client) with prompts (prompts, tokenizer); records hold one
request, metrics summarizes a point, counters differences the server's Prometheus counters, monitor
watches the client itself, results writes the run directory. report.make_report reads run
directories: frontier (Pareto, PCHIP), plots, report.md.
"""
