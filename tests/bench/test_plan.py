"""dflash-bench plan against AIConfigurator's own figures, computed here through its API (the path of its
`cli estimate`): the plain estimate at k = 0, its MTP verify modelling, and its op-level queries of the drafter."""

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("aiconfigurator_core", reason="dflash-bench plan needs the plan extra (pip install '.[plan]')")

from aiconfigurator_core.sdk import common, config_builders, models, perf_database
from aiconfigurator_core.sdk import operations as ops
from aiconfigurator_core.sdk.backends.factory import get_backend
from aiconfigurator_core.sdk.config import RuntimeConfig
from aiconfigurator_core.sdk.engine import EngineHandle, build_ops_json

from trtllm_dflash.bench.overlay import load_plan
from trtllm_dflash.bench.plan import aic
from trtllm_dflash.bench.plan.acceptance import acceptance_from_steps, geometric, read_profile
from trtllm_dflash.bench.plan.inputs import read_drafter
from trtllm_dflash.bench.plan.search import point
from trtllm_dflash.bench.plan.step import StepModel
from trtllm_dflash.cli.bench import main
from trtllm_dflash.draft_length.schedule import read_schedule
from trtllm_dflash.utils.errors import DFlashError

ROOT = Path(__file__).resolve().parents[2]
QWEN_DRAFTER = ROOT / "benchmarks/results/plan/drafters/qwen3-8b-dflash-b16"
QWEN = "Qwen/Qwen3-8B"
ISL = OSL = 1024


def aic_estimate(system: str, model_id: str, tp: int, batch: int, nextn: int = 0, mode: str = "static") -> dict:
    """AIConfigurator's estimate as its `cli estimate` reaches it, from fresh objects."""
    version = perf_database.resolve_query_version(system, "trtllm", "1.3.0rc20")
    db = perf_database.get_database_view(system, "trtllm", version, database_mode="SILICON")
    mc = config_builders.build_model_config(tp, 1, 1, tp, 1)
    config_builders.apply_nextn(mc, nextn)
    models.resolve_context_fmha_by_data(mc, model_id, db, "trtllm", is_context_role=True)
    models.resolve_nvfp4_for_system(mc, system, model_id, backend_name="trtllm")
    model = models.get_model(model_id, mc, "trtllm")
    summary = get_backend("trtllm").run_static(model, db, RuntimeConfig(batch_size=batch, isl=ISL, osl=OSL), mode)
    return summary.get_result_dict()


def step_model(gpu: str, tp: int, verify_attention: str = "per-query") -> StepModel:
    database = aic.open_database(gpu, "1.3.0rc20")
    drafter, _, _ = read_drafter(str(QWEN_DRAFTER))
    return StepModel(aic.build_target(QWEN, tp, database), drafter, database, ISL, OSL, verify_attention)


@pytest.mark.parametrize("gpu,system,tp,batches", [("h100", "h100_sxm", 1, (1, 8, 64)),
                                                   ("b200", "b200_sxm", 2, (1, 32)),
                                                   ("b200", "b200_sxm", 4, (4, 128))])
def test_k0_equals_aiconfigurator_plain_estimate(gpu, system, tp, batches):
    steps = step_model(gpu, tp)
    for batch in batches:
        ref = aic_estimate(system, QWEN, tp, batch)
        cost = steps.cost(batch, 0, 1.0)
        p = point(tp, 1, batch, 0, cost.total_ms, ref["ttft"], OSL)
        assert cost.draft_ms == cost.context_kv_ms == cost.sampling_ms == 0.0
        assert p["tok_s_user"] == pytest.approx(ref["tokens/s/user"], rel=0.01)
        assert p["tok_s_gpu"] == pytest.approx(ref["tokens/s/gpu"], rel=0.01)


def test_verify_is_aiconfigurator_mtp_verify_without_its_layer_factor():
    """AIConfigurator's MTP at draft length k runs b(k+1) decode queries and scales the layers by (L + k) / L
    (models/helpers.py mtp_scale_factor): the plan's verify is that cost divided by the factor."""
    steps, layers = step_model("h100", 1), 36
    for batch, k in ((1, 3), (8, 7), (32, 15)):
        mtp = aic_estimate("h100_sxm", QWEN, 1, batch, nextn=k, mode="static_gen")["tpot"]
        verify = steps.cost(batch, k, 1.0).verify_ms
        assert verify == pytest.approx(mtp * layers / (layers + k), rel=0.01)
        assert verify > aic_estimate("h100_sxm", QWEN, 1, batch, mode="static_gen")["tpot"]


def test_per_request_verify_attention_lies_between_plain_and_per_query():
    per_query, per_request = step_model("h100", 1), step_model("h100", 1, "per-request")
    for batch, k in ((1, 15), (64, 15)):
        plain = per_query.cost(batch, 0, 1.0).total_ms
        assert per_request.cost(batch, 0, 1.0).total_ms == plain
        assert plain < per_request.cost(batch, k, 1.0).verify_ms < per_query.cost(batch, k, 1.0).verify_ms


def test_drafter_cost_equals_the_database_queried_op_by_op():
    """The drafter's block pass: its layers (Qwen3-8B drafter: 5 layers, hidden 4096, MLP 12288, 32/8 heads of
    128), the target's embedding and lm_head (vocab 151936), one op at a time against the same tables."""
    steps, tp, batch, k = step_model("b200", 2), 2, 16, 7
    db = perf_database.get_database_view("b200_sxm", "trtllm", "1.3.0rc20", database_mode="SILICON")
    handle, bf16, n, h = EngineHandle.for_database(db), common.GEMMQuantMode.bfloat16, 5, 4096
    kv_quant = steps.target.model.config.kvcache_quant_mode
    block = [ops.Embedding("e", 1, 151936 // tp, h, 0.3), ops.ElementWise("n1", n, 2 * h, 2 * h, 0.8),
             ops.GEMM("qkv", n, 32 * 128 // tp + 2 * 4 * 128, h, bf16),
             ops.GenerationAttention("att", n, 16, 4, kv_quant, head_size=128, use_qk_norm=True),
             ops.GEMM("o", n, h, 32 * 128 // tp, bf16), ops.ElementWise("n2", n, 2 * h, 2 * h, 0.8),
             ops.GEMM("up", n, 2 * 12288 // tp, h, bf16), ops.ElementWise("act", n, 2 * 12288 // tp, 12288 // tp, 0.8),
             ops.GEMM("down", n, h, 12288 // tp, bf16), ops.CustomAllReduce("ar1", n, h, tp),
             ops.CustomAllReduce("ar2", n, h, tp)]
    head = [ops.ElementWise("norm", 1, h, h, 0.8), ops.GEMM("lm_head", 1, 151936 // tp, h, bf16)]
    s_mid = ISL + OSL // 2 + 1

    def one_by_one(op_list, rows, s):
        return sum(handle.evaluate_ops_json(build_ops_json([op]), is_context=False, batch_size=rows, s=s)[0][1]
                   for op in op_list)

    expected = one_by_one(block, batch * (k + 1), s_mid + k + 1) + one_by_one(head, batch * k, s_mid)
    assert steps.cost(batch, k, 4.0).draft_ms == pytest.approx(expected, rel=1e-6)


def test_acceptance_profiles(tmp_path):
    profile = geometric(6.49, 16)
    assert profile.tokens_per_step(15) == pytest.approx(6.49, rel=1e-6)
    assert profile.tokens_per_step(0) == 1.0
    measured = acceptance_from_steps([(3, n) for n in (1, 2, 3, 4, 4)], "five steps")
    assert measured.per_position == (0.8, 0.75, 2 / 3)
    assert measured.tokens_per_step(3) == pytest.approx(sum([1, 2, 3, 4, 4]) / 5)
    path = tmp_path / "acc.json"
    path.write_text(json.dumps(measured.to_dict()))
    assert read_profile(path).per_position == measured.per_position
    with pytest.raises(DFlashError, match="lie in"):
        geometric(20.0, 16)


def run_cli(capsys, *argv):
    code = main(["plan", "--target", QWEN, "--drafter", str(QWEN_DRAFTER), "--gpus", "1", *argv])
    return code, capsys.readouterr()


@pytest.mark.parametrize("argv,message", [
    (("--gpu", "z9000", "--tau", "5"), "--gpu 'z9000': AIConfigurator has no trtllm data"),
    (("--gpu", "h100", "--acceptance", "ACC"), "per_position must be a list of numbers"),
    (("--gpu", "h100", "--acceptance", "MISSING"), "no such acceptance file"),
    (("--gpu", "h100", "--tau", "5", "--acceptance", "ACC"), "give one of --acceptance FILE or --tau T"),
    (("--gpu", "h100", "--tau", "5", "--tp", "3"), "--tp 3 must divide --gpus 1"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    bad = tmp_path / "acc.json"
    bad.write_text(json.dumps({"per_position": ["high"]}))
    argv = [str(bad) if a == "ACC" else str(tmp_path / "missing.json") if a == "MISSING" else a for a in argv]
    code, out = run_cli(capsys, *argv)
    assert code == 2 and out.out == ""
    assert out.err.count("\n") == 1 and message in out.err


def test_plan_files_and_json(tmp_path, capsys):
    out_dir = tmp_path / "plan"
    code, out = run_cli(capsys, "--gpu", "h100", "--tau", "6.49", "--batches", "1", "8", "64",
                        "--interactivity", "100", "1000", "--output", str(out_dir), "--json")
    assert code == 0
    plan = json.loads(out.out)
    assert plan == json.loads((out_dir / "plan.json").read_text())
    assert {"inputs", "frontier", "at_interactivity", "provenance"} <= set(plan)
    for entry in plan["frontier"]["plain"] + plan["frontier"]["dflash"]:
        assert {"batch", "draft_len", "tok_s_user", "tok_s_gpu", "tp"} <= set(entry)
    for entry in plan["frontier"]["plain"]:
        ref = aic_estimate("h100_sxm", QWEN, 1, entry["batch"])
        assert entry["tok_s_gpu"] == pytest.approx(ref["tokens/s/gpu"], rel=0.01)
    at_100, at_1000 = plan["at_interactivity"]
    assert at_100["ratio"] == pytest.approx(at_100["dflash_tok_s_gpu"] / at_100["plain_tok_s_gpu"], rel=1e-3)
    assert at_1000["plain_tok_s_gpu"] is None and at_1000["ratio"] is None
    assert at_100["config"]["build_command"].startswith("dflash-build --backend trtllm")
    schedule = read_schedule(out_dir / at_100["config"]["draft_len_schedule"])
    assert schedule.max_draft_len >= 1
    assert plan["provenance"]["backend_version"] == "1.3.0rc20" and "tau" in plan["provenance"]["acceptance"]
    assert (out_dir / "frontier.png").stat().st_size > 0 and (out_dir / "points.csv").read_text().count("\n") > 3
    assert math.isclose(plan["inputs"]["acceptance_per_position"][0], geometric(6.49, 16).per_position[0],
                        rel_tol=1e-3)
    overlaid = load_plan(out_dir)  # what dflash-bench report --plan reads
    assert overlaid.fronts["dflash"] == [(p["tok_s_user"], p["tok_s_gpu"]) for p in plan["frontier"]["dflash"]]


def test_without_aiconfigurator_one_line_names_the_extra(monkeypatch, capsys):
    import sys

    for name in [n for n in sys.modules if n.split(".")[0] == "aiconfigurator_core"]:
        monkeypatch.setitem(sys.modules, name, None)
    code, out = run_cli(capsys, "--gpu", "h100", "--tau", "5")
    assert code == 2 and out.err.count("\n") == 1 and "pip install '.[plan]'" in out.err


def generate_json_lines(builtin, prompts, draft_len: int) -> str:
    """dflash-generate --json on the builtin pair, one output line a prompt (its CLI, in process)."""
    import contextlib
    import io

    from trtllm_dflash.cli.generate import main as generate

    lines = []
    for prompt in prompts:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert generate(["--target", str(builtin[0]), "--drafter", str(builtin[1]), "--prompt-ids",
                             ",".join(map(str, prompt)), "--max-new-tokens", "48", "--ignore-eos",
                             "--draft-len", str(draft_len), "--json"]) == 0
        lines.append(out.getvalue().strip())
    return "\n".join(lines) + "\n"


@pytest.mark.slow
def test_profile_from_generate_runs_is_what_plan_reads(builtin, tmp_path, capsys):
    """A real tiny run at a fixed draft length: `dflash-bench acceptance` writes the profile, plan reads it, and
    the rates are the run's accepted lengths counted here: a_i = #(n > i) / #(n >= i) over every step but each
    request's last (cut at the length limit)."""
    from helpers.tiny_pair import held_out_prompts

    k = 7  # the builtin drafter's block of 8, less the anchor
    runs = tmp_path / "runs.jsonl"
    runs.write_text(generate_json_lines(builtin, held_out_prompts(2), k))
    lengths = [n for line in runs.read_text().splitlines() for n in json.loads(line)["acceptance_lengths"][:-1]]
    assert all(d == k for line in runs.read_text().splitlines() for d in json.loads(line)["draft_lengths"])
    expected = []
    for i in range(1, k + 1):
        tried = sum(1 for n in lengths if n >= i)
        if not tried:
            break
        expected.append(sum(1 for n in lengths if n > i) / tried)
    assert expected and max(expected) > 0  # the fitted drafter is accepted

    acc = tmp_path / "acc.json"
    assert main(["acceptance", str(runs), "--output", str(acc)]) == 0
    capsys.readouterr()
    assert read_profile(acc).per_position == pytest.approx(expected, abs=1e-12)
    code, out = run_cli(capsys, "--gpu", "h100", "--acceptance", str(acc), "--batches", "1", "8",
                        "--interactivity", "100", "--json")
    assert code == 0
    plan = json.loads(out.out)
    assert plan["inputs"]["acceptance_per_position"] == [round(a, 4) for a in expected]
    assert plan["inputs"]["max_draft_len"] == len(expected) and str(acc) in plan["provenance"]["acceptance"]
    for entry in plan["frontier"]["dflash"]:
        reach = [math.prod(expected[:i]) for i in range(1, entry["draft_len"] + 1)]
        assert entry["tokens_per_step"] == pytest.approx(1 + sum(reach), abs=1e-3)
        assert 1 <= entry["draft_len"] <= len(expected)


def test_profile_from_steps_and_from_a_sweep(tmp_path):
    """Variable draft lengths: a position counts only the steps that drafted it; a sweep's totals give a fitted
    constant rate whose expected accepted drafts equal the measured ones."""
    steps = [(3, 1), (3, 2), (3, 4), (1, 2), (0, 1), (2, 3)]
    measured = acceptance_from_steps(steps, "steps")
    assert measured.per_position == (4 / 5, 2 / 3, 1.0) and measured.observations == (5, 3, 1)
    run = tmp_path / "sweep"
    run.mkdir()
    (run / "manifest.json").write_text("{}")
    (run / "summary.json").write_text(json.dumps({"points": [{"draft_len_mean": 4.0, "plain_step_share": 0.0}]}))
    rows = [{"ok": True, "server_draft_tokens": 40, "server_accepted_draft_tokens": 22},
            {"ok": True, "server_draft_tokens": 20, "server_accepted_draft_tokens": 8}, {"ok": False}]
    (run / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    acc = tmp_path / "sweep.json"
    assert main(["acceptance", str(run), "--output", str(acc)]) == 0
    profile = read_profile(acc)
    rate = profile.per_position[0]
    assert profile.per_position == (rate,) * 4 and "geometric fit" in profile.source
    assert sum(rate ** i for i in range(1, 5)) == pytest.approx(4 * 30 / 60, rel=1e-9)
    (run / "summary.json").write_text(json.dumps({"points": [{"draft_len_mean": 3.2, "plain_step_share": 0.1}]}))
    assert main(["acceptance", str(run), "--output", str(acc)]) == 2


EAGLE3 = ROOT / "benchmarks/results/plan/drafters/qwen3-8b-eagle3"


def test_eagle3_step_is_k_passes_of_its_layer_queried_op_by_op():
    """EAGLE-3 (one Qwen3-8B-shaped layer, draft vocabulary 32000, fc over 3 x 4096): pass 1 over the b(k+1)
    verified tokens, passes 2..k over b, lm_head + argmax after each; the same tables one op at a time."""
    from trtllm_dflash.bench.plan.eagle3 import Eagle3Steps, read_eagle3

    steps, tp, batch, k = step_model("b200", 2), 2, 8, 4
    eagle = Eagle3Steps(steps, read_eagle3(str(EAGLE3)))
    db = perf_database.get_database_view("b200_sxm", "trtllm", "1.3.0rc20", database_mode="SILICON")
    handle, bf16, h = EngineHandle.for_database(db), common.GEMMQuantMode.bfloat16, 4096
    kv_quant = steps.target.model.config.kvcache_quant_mode
    layer = [ops.ElementWise("n", 1, 4 * h, 2 * h, 0.8), ops.GEMM("qkv", 1, (16 + 2 * 4) * 128, 2 * h, bf16),
             ops.GEMM("o", 1, h, 16 * 128, bf16), ops.ElementWise("n2", 1, 2 * h, 2 * h, 0.8),
             ops.GEMM("up", 1, 12288, h, bf16), ops.ElementWise("act", 1, 12288, 6144, 0.8),
             ops.GEMM("down", 1, h, 6144, bf16), ops.CustomAllReduce("ar1", 1, h, tp), ops.CustomAllReduce("ar2", 1, h, tp)]
    attention = [ops.GenerationAttention("att", 1, 16, 4, kv_quant, head_size=128)]
    head = [ops.ElementWise("norm", 1, h, h, 0.8), ops.GEMM("lm_head", 1, 16000, h, bf16),
            ops.ElementWise("argmax", 1, 16000, 1, 0.8)]
    s_mid = ISL + OSL // 2 + 1

    def one_by_one(op_list, rows, s):
        return sum(handle.evaluate_ops_json(build_ops_json([op]), is_context=False, batch_size=rows, s=s)[0][1]
                   for op in op_list)

    block = batch * (k + 1)
    fc = [ops.GEMM("fc", 1, h, 3 * h, bf16), ops.Embedding("e", 1, 151936 // tp, h, 0.3)]
    expected = (one_by_one(fc + layer, block, s_mid) + one_by_one(attention, block, s_mid + k + 1)
                + one_by_one(head, batch, s_mid)
                + sum(one_by_one(layer + attention, batch, s_mid + i) + one_by_one(head, batch, s_mid)
                      for i in range(1, k)))
    cost = eagle.cost(batch, k)
    assert cost.draft_ms == pytest.approx(expected, rel=1e-6)
    assert cost.verify_ms == steps.cost(batch, k, 1.0).verify_ms  # the same target verify as DFlash's
    assert cost.context_kv_ms == pytest.approx(one_by_one([ops.ElementWise("c", 1, 3 * h, 3 * h, 0.8)], block, s_mid))


def test_plan_with_an_eagle3_baseline(capsys):
    code, out = run_cli(capsys, "--gpu", "h100", "--tau", "6.49", "--batches", "1", "16", "--interactivity", "100",
                        "--eagle3", str(EAGLE3), "--eagle3-tau", "3.0", "--json")
    assert code == 0
    plan = json.loads(out.out)
    front = plan["frontier"]["eagle3"]
    assert front and all(1 <= p["draft_len"] <= 3 for p in front)
    assert plan["inputs"]["eagle3_shape"]["acceptance_per_position"] == [round(a, 4) for a in geometric(3.0, 4).per_position]
    row = plan["at_interactivity"][0]
    assert row["dflash_over_eagle3"] == pytest.approx(row["dflash_tok_s_gpu"] / row["eagle3_tok_s_gpu"], rel=1e-3)
    code, out = run_cli(capsys, "--gpu", "h100", "--tau", "6.49", "--eagle3", str(EAGLE3))
    assert code == 2 and "--eagle3 needs one of --eagle3-acceptance FILE or --eagle3-tau T" in out.err


def write_dflash2(tmp_path, window=None, speculators=False):
    """The Qwen3-8B drafter's shapes as a DFlash2 drafter (z-lab's layout, or speculators'), block 8."""
    v1 = json.loads((QWEN_DRAFTER / "config.json").read_text())
    extra = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16}
    if speculators:
        layer = {k: v for k, v in v1.items() if k not in ("architectures", "block_size", "num_target_layers",
                                                          "dflash_config")}
        config = {"speculators_model_type": "dflash2", "architectures": ["DFlash2DraftModel"],
                  "transformer_layer_config": layer, "draft_vocab_size": 151936, "block_size": 8,
                  "aux_hidden_state_layer_ids": [2, 10, 18, 26, 34], "mask_token_id": 151669,
                  "sliding_window_non_causal": True, **extra}
    else:
        config = {**v1, "architectures": ["DFlash2DraftModel"], "block_size": 8, "is_causal": False,
                  "dflash_config": {**v1["dflash_config"], **extra}}
        if window:
            config.update(use_sliding_window=True, sliding_window=window, layer_types=["sliding_attention"] * 5)
    folder = tmp_path / ("spec" if speculators else f"dflash2-{window}")
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_dflash2_method_read_from_its_config(tmp_path):
    for folder in (write_dflash2(tmp_path), write_dflash2(tmp_path, speculators=True), write_dflash2(tmp_path, 512)):
        drafter, _, shape = read_drafter(str(folder))
        assert shape is not None and (shape.conv_kernel_size, shape.conv_group_size) == (2, 16)
        assert (shape.selector_rank, shape.selector_top_k) == (256, 16)
        assert drafter.block_size == 8 and drafter.hidden_size == 4096 and drafter.num_hidden_layers == 5
        assert list(drafter.target_layer_ids) == [1, 9, 17, 25, 33]
    assert read_drafter(str(tmp_path / "dflash2-None"))[2].sliding_window is None
    assert read_drafter(str(tmp_path / "dflash2-512"))[2].sliding_window == 512
    assert read_drafter(str(QWEN_DRAFTER))[2] is None


def test_dflash2_adds_its_convolutions_and_selector_queried_op_by_op(tmp_path):
    """Beside the same drafter as DFlash: per layer 2 kernel_projection GEMMs (4096 -> 2 x 2 x 4096 / 16) and 4
    grouped convolutions over the block's tokens; per drafted slot top-16 over the rank's vocabulary, the
    4096 -> 256 hidden_projection and 16 x 256 scoring, in place of that slot's argmax."""
    database = aic.open_database("b200", "1.3.0rc20")
    target = aic.build_target(QWEN, 2, database)
    drafter, _, shape = read_drafter(str(write_dflash2(tmp_path)))
    v1 = StepModel(target, drafter, database, ISL, OSL)
    v2 = StepModel(target, drafter, database, ISL, OSL, dflash2=shape)
    db = perf_database.get_database_view("b200_sxm", "trtllm", "1.3.0rc20", database_mode="SILICON")
    handle, bf16, h = EngineHandle.for_database(db), common.GEMMQuantMode.bfloat16, 4096
    s_mid, batch, k = ISL + OSL // 2 + 1, 16, 7

    def one_by_one(op_list, rows, s):
        return sum(handle.evaluate_ops_json(build_ops_json([op]), is_context=False, batch_size=rows, s=s)[0][1]
                   for op in op_list)

    conv = [ops.GEMM("kp", 10, 2 * 2 * 256, h, bf16), ops.ElementWise("conv", 20, 2 * h + 2 * 256, h, 0.8)]
    selector = [ops.ElementWise("topk", 1, 151936 // 2, 32, 0.8), ops.GEMM("hp", 1, 256, h, bf16),
                ops.ElementWise("score", 1, 18 * 256, 16, 0.8)]
    argmax = [ops.ElementWise("argmax", 1, 151936 // 2, 1, 0.8)]
    a, b = v1.cost(batch, k, 3.0), v2.cost(batch, k, 3.0)
    assert b.draft_ms - a.draft_ms == pytest.approx(one_by_one(conv, batch * (k + 1), s_mid + k + 1)
                                                    + one_by_one(selector, batch * k, s_mid), rel=1e-6)
    assert a.sampling_ms == pytest.approx(one_by_one(argmax, 2 * batch * k, s_mid), rel=1e-6)  # verify + drafted
    assert b.sampling_ms == pytest.approx(one_by_one(argmax, batch * k, s_mid), rel=1e-6)  # verify's slots only
    assert b.verify_ms == a.verify_ms and b.context_kv_ms == a.context_kv_ms
    # a sliding window of 256 keys: the drafter's attention reads 256 - 1 + the block, not the whole context
    windowed = StepModel(target, drafter, database, ISL, OSL, dflash2=read_drafter(str(write_dflash2(tmp_path, 256)))[2])
    att = v2.attention_ops
    assert b.draft_ms - windowed.cost(batch, k, 3.0).draft_ms == pytest.approx(
        one_by_one(att + conv, batch * (k + 1), s_mid + k + 1) - one_by_one(att + conv, batch * (k + 1), 256 + k),
        rel=1e-6, abs=1e-9)
