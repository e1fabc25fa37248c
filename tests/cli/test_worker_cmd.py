"""``inflight worker`` flags reach the engine arguments (no services needed)."""

from __future__ import annotations

from cli.main import build_parser
from cli.worker_cmd import config_from_args


def test_engine_flags_become_engine_kwargs(monkeypatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "sqlite:///x.db")
    args = build_parser("worker").parse_args([
        "worker", "--model", "tiny-llama", "--max-num-seqs", "8", "--num-speculative-tokens", "4",
        "--speculative-max-rows", "32", "--attention-backend", "torch", "--no-prepack-weights",
    ])
    config = config_from_args(args)
    assert config.model == "tiny-llama"
    assert config.engine_kwargs == {
        "max_num_seqs": 8, "num_speculative_tokens": 4, "speculative_max_rows": 32,
        "attention_backend": "torch", "prepack_weights": False,
    }


def test_unset_engine_flags_keep_the_engine_defaults(monkeypatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "sqlite:///x.db")
    config = config_from_args(build_parser("worker").parse_args(["worker"]))
    assert config.engine_kwargs == {}


def test_worker_takes_the_shared_engine_flags(monkeypatch, capsys) -> None:
    import pytest

    monkeypatch.setenv("DATABASE_URL", "sqlite:///x.db")
    args = build_parser("worker").parse_args(["worker", "--kv-cache-memory", "2GiB", "--seed", "3",
                                              "--commit-kv-pool"])
    assert config_from_args(args).engine_kwargs == {"kv_cache_memory": 2 * 2**30, "seed": 3,
                                                    "commit_kv_pool": True}
    with pytest.raises(SystemExit):
        build_parser("worker").parse_args(["worker", "--policy", "bogus"])
    assert "invalid choice" in capsys.readouterr().err


def test_a_model_that_cannot_be_found_is_a_clear_error_not_a_traceback(tmp_path, capsys) -> None:
    from cli.main import main

    missing = tmp_path / "no-checkpoint-here"
    code = main(["worker", "--model", str(missing),
                 "--database-url", f"sqlite:///{tmp_path / 'w.db'}", "--log-level", "ERROR"])
    assert code == 1
    err = capsys.readouterr().err
    assert f"inflight worker: error: could not load the model '{missing}'" in err
    assert "not a checkpoint directory or a .gguf file" in err and "Traceback" not in err


def test_the_gil_switch_interval_flag_and_a_bad_value(capsys) -> None:
    from cli.worker_cmd import GIL_SWITCH_MS, run

    assert build_parser("worker").parse_args(["worker"]).gil_switch_ms == GIL_SWITCH_MS == 0.2
    args = build_parser("worker").parse_args(["worker", "--gil-switch-ms", "0"])
    assert run(args) == 2  # refused before anything connects or changes the interpreter
    assert "--gil-switch-ms must be > 0" in capsys.readouterr().err
