"""benchmarks/tree_ab.py: each arm runs its own tree's script on its own site, the headline numbers are read
from the scripts' own record shapes, and the summary's ratios and verdict follow from the runs."""

import importlib
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    """The benchmark scripts as modules (they are scripts, not a package)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return lambda name: importlib.import_module(name)


def test_site_lays_out_the_flat_and_the_folder_layout_alike(bench, tmp_path):
    site = bench("paged_vs_slot").site
    for layout, plugins in [("flat", "plugins"), ("folders", "trtllm_dflash/plugins")]:
        tree = tmp_path / layout
        for path in ["trtllm_dflash/__init__.py", f"{plugins}/__init__.py", "trtllm_dflash/__pycache__/x.pyc"]:
            (tree / path).parent.mkdir(parents=True, exist_ok=True)
            (tree / path).write_text("")
        out = site(tree, tmp_path / f"site-{layout}")
        assert (out / "trtllm_dflash" / "plugins" / "__init__.py").is_file()
        assert not (out / "plugins").exists() and not (out / "trtllm_dflash" / "__pycache__").exists()


FAKE_SCRIPT = """
import json, os, sys
from pathlib import Path

def serve(*args, package=None):
    return package

def main():
    out = Path(sys.argv[sys.argv.index("--output") + 1])
    out.write_text(json.dumps({"file": __file__, "argv": sys.argv[1:], "omp": os.environ["OMP_NUM_THREADS"],
                               "pythonpath": os.environ["PYTHONPATH"], "served": str(serve())}))
"""


def test_an_arm_runs_its_trees_copy_of_the_script_on_its_site(bench, tmp_path):
    tree_ab = bench("tree_ab")
    tree, site = tmp_path / "tree", tmp_path / "site"
    (tree / "benchmarks").mkdir(parents=True)
    (tree / "benchmarks" / "serve_dflash_vs_plain.py").write_text(FAKE_SCRIPT)
    args = SimpleNamespace(script="serve_dflash_vs_plain.py", script_args=["--repeats", "1"], threads=3)
    got = tree_ab.run_arm(tree, site, args, tmp_path / "out.json")
    assert got["file"] == str(tree / "benchmarks" / "serve_dflash_vs_plain.py")
    assert got["argv"] == ["--repeats", "1", "--threads", "3", "--output", str(tmp_path / "out.json")]
    assert (got["omp"], got["pythonpath"], got["served"]) == ("3", str(site), str(site))


def test_cpu_decode_headlines_are_its_case_medians(bench):
    cpu_decode, tree_ab = bench("cpu_decode"), bench("tree_ab")
    cases = {"dflash_vs_plain": cpu_decode.summary("dflash_vs_plain", [2.0, 2.4, 2.2]),
             "sampling_overhead": cpu_decode.summary("sampling_overhead", [0.01, 0.03, 0.02])}
    got = tree_ab.cpu_decode_headlines({"cases": cases})
    assert got == {"dflash_vs_plain": (2.2, "higher"), "sampling_overhead": (pytest.approx(1.02), "lower")}


def test_serve_headlines_are_tokens_per_second_and_dflash_over_plain_per_point(bench):
    serve, tree_ab = bench("serve_dflash_vs_plain"), bench("tree_ab")
    rows = [{"decoding": name, "context": "short", "concurrency": 4, "repeat": rep, "output_tokens_per_s": tps,
             "draft_len_mean": 3.0, "plain_step_share": 0.0}
            for rep, (plain, dflash) in enumerate([(10.0, 30.0), (20.0, 30.0)])
            for name, tps in [("plain", plain), ("dflash", dflash)]]
    got = tree_ab.serve_headlines({"table": serve.summarize(rows, 2, ["plain", "dflash"])})
    assert got == {"short c=4 plain tok/s": (15.0, "higher"), "short c=4 dflash tok/s": (30.0, "higher"),
                   "short c=4 dflash/plain": (2.25, "higher")}


def test_summary_ratios_per_round_and_the_verdict_against_the_control(bench):
    tree_ab = bench("tree_ab")
    values = {"base": [10.0, 10.0], "head": [9.0, 11.0], "control": [9.9, 10.5]}
    runs = [{"arm": arm, "round": r, "metrics": {"tok/s": v[r], "ttft": v[r]}} for arm, v in values.items()
            for r in range(2)]
    got = tree_ab.summarize(runs, {"tok/s": "higher", "ttft": "lower"}, 2)
    speed = got["tok/s"]
    assert speed["head_over_base"]["each"] == pytest.approx([0.9, 1.1])
    assert speed["control_over_head"]["each"] == pytest.approx([1.1, 10.5 / 11])
    assert speed["within_control"] and got["ttft"]["within_control"]  # median 1.0: inside [0.955, 1.1]
    runs[2]["metrics"]["tok/s"] = runs[3]["metrics"]["tok/s"] = 8.0  # head 20 % slower than base
    assert not tree_ab.summarize(runs, {"tok/s": "higher"}, 2)["tok/s"]["within_control"]
    assert "tok/s" in tree_ab.table(got) and json.dumps(got)


def test_flags_it_sets_itself_are_refused_after_the_separator(bench, capsys):
    tree_ab = bench("tree_ab")
    args = tree_ab.parse(["--base", "HEAD", "--script", "cpu_decode.py", "--", "--repeats", "1"])
    assert args.script_args == ["--repeats", "1"] and args.out.name == "cpu_decode.json"
    with pytest.raises(SystemExit):
        tree_ab.parse(["--base", "HEAD", "--script", "cpu_decode.py", "--", "--output=x.json"])
    assert "tree_ab sets it" in capsys.readouterr().err
    assert sys.modules["tree_ab"].HEADLINES
