"""Where step-cost models go: one cache per engine for every command, beside a writable engine, the user's cache
for a read-only one, or where TRTLLM_DFLASH_CACHE_DIR says; XDG_CACHE_HOME honoured."""

from pathlib import Path

from trtllm_dflash.engine.draft_len import engine_cache

from trtllm_dflash.draft_length.cost import CostModel
from trtllm_dflash.utils.user_cache import user_cache_home

KEY = {"device": "cpu: test", "threads": 1}


def model() -> CostModel:
    return CostModel((1,), (0, 3), (16,), [[[0.001, 0.002]]], dict(KEY))


def test_beside_a_writable_engine(tmp_path, monkeypatch):
    monkeypatch.delenv("TRTLLM_DFLASH_CACHE_DIR", raising=False)
    where = engine_cache(tmp_path / "engine").save(model(), KEY)
    assert where.parent == tmp_path / "engine" / "calibration"
    again = engine_cache(tmp_path / "engine")
    assert again.load(KEY) == model() and again.loaded_from == where


def test_a_read_only_engine_falls_back_to_the_users_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("TRTLLM_DFLASH_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRTLLM_DFLASH_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    engine = tmp_path / "engine"
    engine.write_text("")  # ENGINE/calibration cannot be made (as on a read-only mount, which root could write)
    where = engine_cache(engine).save(model(), KEY)
    assert where.is_relative_to(tmp_path / "xdg" / "trtllm-dflash" / "calibration")
    assert engine_cache(engine).load(KEY) == model()


def test_the_cache_dir_the_user_names(tmp_path, monkeypatch):
    monkeypatch.setenv("TRTLLM_DFLASH_CACHE_DIR", str(tmp_path / "mine"))
    where = engine_cache(tmp_path / "engine").save(model(), KEY)
    assert where.is_relative_to(tmp_path / "mine") and not (tmp_path / "engine").exists()


def test_home_overrides_xdg(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("TRTLLM_DFLASH_HOME", str(tmp_path / "home"))
    assert user_cache_home() == tmp_path / "home"
    monkeypatch.delenv("TRTLLM_DFLASH_HOME")
    assert user_cache_home() == Path(tmp_path / "xdg" / "trtllm-dflash")


def test_dflash_generate_from_checkpoints_measures_nothing_and_writes_no_cache(
        hf_target, random_drafter, tmp_path, monkeypatch, capsys):
    """`auto` decides from the run's own steps: nothing is measured before the request, nothing is cached."""
    from trtllm_dflash.cli.generate import main

    _, target = hf_target
    monkeypatch.setenv("TRTLLM_DFLASH_CACHE_DIR", str(tmp_path / "mine"))
    main(["--target", str(target), "--drafter", str(random_drafter), "--prompt-ids", "1,2,3",
          "--max-new-tokens", "4", "--draft-len", "auto", "--threads", "1"])
    assert "step-cost" not in capsys.readouterr().err
    assert not (tmp_path / "mine").exists()
