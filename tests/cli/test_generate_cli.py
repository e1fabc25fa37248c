"""``inflight generate``: planning, resume, the engine loop, and end to end on tiny-llama."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cli.generate_cmd import LinePlanner
from cli.generate_loop import Progress, WorkItem, run_requests
from cli.jsonl_io import ResultsFile, count_input_lines, iter_input_lines, prepare_output
from cli.main import main
from tests.jsonl import read_jsonl
from worker.protocol.openai_batch import parse_request_line
from worker.protocol.sampling_params import InvalidRequestError

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def write_lines(path: Path, lines: list[object]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def read_output(path: Path) -> dict[str, dict]:
    rows = read_jsonl(path.read_text())
    by_id = {row["custom_id"]: row for row in rows}
    assert len(by_id) == len(rows), "a custom_id was written twice"
    return by_id


# -- planning and the output file (no engine) ---------------------------------------------


def test_plan_lines_ids_duplicates_and_skips():
    lines = [(1, b'{"prompt": "a"}'), (2, b'{"custom_id": "x", "prompt": "b"}'),
             (4, b"{oops"), (5, b'{"custom_id": "x", "prompt": "c"}'),
             (6, b'{"custom_id": "y", "prompt": "d", "bad": 1}'), (7, b'{"prompt": "e"}')]
    planner = LinePlanner(done={"line-7"})
    items = list(planner.items(lines))
    assert planner.skipped == 1
    assert [i.custom_id for i in items] == ["line-1", "x", "line-4", "line-5", "y"]
    assert items[0].request is not None and not items[0].own_id
    assert items[2].error is not None and items[2].error.code == "invalid_json"
    dup = items[3].error
    assert dup is not None and dup.code == "duplicate_custom_id"
    assert "duplicate custom_id 'x' (first on line 2)" in str(dup)
    assert items[4].error is not None and items[4].custom_id == "y"


def test_prepare_output_cuts_a_torn_last_line(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text('{"custom_id": "a"}\nnot json\n{"custom_id": "b"}\n{"custom_id": "c", "res')
    assert prepare_output(str(out), resume=True) == {"a", "b"}
    assert out.read_text().endswith('"b"}\n')
    assert prepare_output(str(out), resume=False) == set()
    assert out.read_text() == ""


def test_read_input_lines_skips_blank_lines_keeping_numbers(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n\n  \n{"prompt": "b"}')
    assert list(iter_input_lines(str(path))) == [(1, b'{"prompt": "a"}'), (4, b'{"prompt": "b"}')]
    assert count_input_lines(str(path)) == 2
    path.write_bytes(b'{"prompt": "a"}\r\n{"prompt": "b"}\r\n')
    assert list(iter_input_lines(str(path))) == [(1, b'{"prompt": "a"}'), (2, b'{"prompt": "b"}')]


# -- the engine loop, on a fake engine ------------------------------------------------------


@dataclass
class FakeOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    finished: bool
    text: str = ""
    finish_reason: str | None = None
    new_token_ids: list[int] = field(default_factory=list)
    logprobs: list | None = None
    error: str | None = None
    samples: list = field(default_factory=list)


class FakeEngine:
    """Each request generates ``len(prompt)`` tokens, one per step; prompts over 8 refused."""

    model_name = "fake"
    tokenizer = None

    def __init__(self) -> None:
        self.live: dict[str, list[int]] = {}
        self.out: dict[str, list[int]] = {}
        self.most_live = 0

    def tokenize(self, prompt=None, messages=None):
        text = prompt if prompt is not None else messages[-1]["content"]
        return [ord(c) % 50 for c in text]

    def add_request(self, request_id, ids, params, *, prompt=None):
        if len(ids) > 8:
            raise InvalidRequestError(f"the prompt has {len(ids)} tokens; the context is 8")
        self.live[request_id] = ids
        self.out[request_id] = []
        self.most_live = max(self.most_live, len(self.live))

    def num_unfinished_requests(self):
        return len(self.live)

    def has_unfinished_requests(self):
        return bool(self.live)

    def step(self):
        outputs = []
        for rid, ids in list(self.live.items()):
            self.out[rid].append(7)
            done = len(self.out[rid]) >= len(ids)
            if done:
                del self.live[rid]
            outputs.append(FakeOutput(rid, ids, list(self.out[rid]), done, text="x" * len(ids),
                                      finish_reason="length" if done else None,
                                      new_token_ids=[7]))
        return outputs, None


def test_run_requests_writes_in_finish_order_and_refuses_alone(tmp_path):
    texts = ["aaaa", "b", "ccccccccccccc", "dd", "eee"]
    items = [WorkItem(i + 1, f"id{i}", request=parse_request_line(
        json.dumps({"prompt": t}), line_number=i + 1)) for i, t in enumerate(texts)]
    engine = FakeEngine()
    out = tmp_path / "out.jsonl"
    progress = Progress(len(items), enabled=False)
    with ResultsFile(str(out)) as writer:
        run_requests(lambda: engine, items, writer, progress, window=2)
    rows = read_jsonl(out.read_text())
    # id1 finishes first; id2 is refused when it is fed; id3 overtakes id0.
    assert [r["custom_id"] for r in rows] == ["id1", "id2", "id3", "id0", "id4"]
    assert engine.most_live == 2
    refused = rows[1]
    assert refused["response"]["status_code"] == 400
    assert refused["error"]["message"] == ("line 3 (custom_id 'id2'): the prompt has 13 tokens; "
                                           "the context is 8")
    ok = rows[0]["response"]
    assert ok["status_code"] == 200 and ok["body"]["choices"][0]["text"] == "x"
    assert ok["body"]["model"] == "fake" and ok["body"]["usage"]["completion_tokens"] == 1
    assert progress.done == 5 and progress.failed == 1 and progress.tokens == 10


def test_run_requests_reads_the_input_as_it_works(tmp_path):
    """Lines are pulled only while the window has room, so a long file is never held."""
    pulled = []

    def lines():
        for i in range(200):
            pulled.append(i)
            yield WorkItem(i + 1, f"id{i}", request=parse_request_line(
                json.dumps({"prompt": "abc"}), line_number=i + 1))

    engine = FakeEngine()
    most_ahead = 0
    real_step = engine.step

    def step():
        nonlocal most_ahead
        written = progress.done
        most_ahead = max(most_ahead, len(pulled) - written)
        return real_step()

    engine.step = step  # type: ignore[method-assign]
    progress = Progress(None, enabled=False)
    with ResultsFile(str(tmp_path / "out.jsonl")) as writer:
        run_requests(lambda: engine, lines(), writer, progress, window=4)
    assert progress.done == 200 and progress.failed == 0
    assert most_ahead <= 4  # never more lines read than the window holds


def test_run_requests_does_not_load_an_engine_for_refused_lines_only(tmp_path):
    bad = WorkItem(1, "line-1", own_id=False, error=parse_error(b"{oops"))
    out = tmp_path / "out.jsonl"
    progress = Progress(1, enabled=False)

    def no_engine():
        raise AssertionError("the engine was loaded for a file without a valid line")

    with ResultsFile(str(out)) as writer:
        run_requests(no_engine, [bad], writer, progress, window=4)
    (row,) = read_jsonl(out.read_text())
    assert row["custom_id"] == "line-1" and row["error"]["code"] == "invalid_json"


def parse_error(raw: bytes):
    from worker.protocol.openai_batch import RequestParseError

    try:
        parse_request_line(raw, line_number=1)
    except RequestParseError as exc:
        return exc
    raise AssertionError("the line parsed")


# -- the command ---------------------------------------------------------------------------


def test_inflight_help_is_fast_and_torch_free():
    code = ("import sys; from cli.main import main\n"
            "for argv in (['--help'], ['generate', '--help']):\n"
            "    try: main(argv)\n"
            "    except SystemExit as e: assert e.code == 0\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')]\n"
            "assert not bad, bad[:5]")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "generate" in result.stdout and "--max-num-seqs" in result.stdout


def test_no_command_and_missing_input(tmp_path, capsys):
    assert main([]) == 2
    assert main(["generate", str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_missing_subcommand_module_is_a_clear_error(monkeypatch, capsys):
    from cli import main as main_module

    monkeypatch.setitem(main_module.SUBCOMMANDS, "ghost", ("cli.ghost_cmd", "not here"))
    assert main(["ghost"]) == 2
    assert "the 'ghost' command is not available" in capsys.readouterr().err


def test_unwritable_output_is_a_clear_error(tmp_path, capsys):
    inp = write_lines(tmp_path / "in.jsonl", [{"prompt": "x"}])
    assert main(["generate", str(inp), "-o", str(tmp_path)]) == 2
    assert "inflight generate: error:" in capsys.readouterr().err


def test_bad_engine_flag_is_a_clear_error(tmp_path, capsys):
    inp = write_lines(tmp_path / "in.jsonl", [{"prompt": "x"}])
    assert main(["generate", str(inp), "-o", str(tmp_path / "o"), "--block-size", "3"]) == 2
    assert "block_size=3: must be a power of two" in capsys.readouterr().err


def test_only_bad_lines_need_no_engine(tmp_path):
    inp = write_lines(tmp_path / "in.jsonl", ["{bad", {"prompt": "x", "nope": 1}])
    out = tmp_path / "out.jsonl"
    assert main(["generate", str(inp), "-o", str(out), "--model", "no-such-model", "-q"]) == 0
    rows = read_output(out)
    assert set(rows) == {"line-1", "line-2"}
    assert all(r["response"]["status_code"] == 400 for r in rows.values())


def test_a_model_path_that_does_not_exist_is_a_clear_error(tmp_path, capsys):
    inp = write_lines(tmp_path / "in.jsonl", [{"prompt": "x", "max_tokens": 2}])
    missing = tmp_path / "no-checkpoint-here"
    assert main(["generate", str(inp), "-o", str(tmp_path / "o.jsonl"), "--model", str(missing),
                 "-q"]) == 1
    err = capsys.readouterr().err
    assert f"could not load the model '{missing}'" in err and "not a checkpoint" in err


def test_a_finished_output_is_nothing_to_do_and_loads_no_model(tmp_path, capsys):
    inp = write_lines(tmp_path / "in.jsonl", [{"custom_id": "a", "prompt": "x"}])
    out = write_lines(tmp_path / "out.jsonl", [{"custom_id": "a", "response": {}}])
    assert main(["generate", str(inp), "-o", str(out), "--model", "no-such-model"]) == 0
    err = capsys.readouterr().err
    assert "resuming: 1 line(s) already in" in err and "nothing to do" in err


# -- end to end on tiny-llama ---------------------------------------------------------------

LONG_PROMPT = [5] * 1100  # longer than tiny-llama's 1024-token context
MIXED = [
    {"custom_id": "chat", "method": "POST", "url": CHAT,
     "body": {"model": "whatever", "messages": [{"role": "user", "content": "Tell me a story"}],
              "max_completion_tokens": 6, "temperature": 0, "logprobs": True,
              "top_logprobs": 2}},
    {"custom_id": "comp", "method": "POST", "url": COMPLETIONS,
     "body": {"prompt": "The quick brown fox", "max_tokens": 5, "temperature": 0}},
    {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0.8, "seed": 1},
    "{this is not json",
    "",
    {"custom_id": "unknown", "prompt": "x", "max_tokens": 2, "frequency": 1},
    {"custom_id": "too-long", "prompt": LONG_PROMPT, "max_tokens": 2},
    {"custom_id": "too-big", "prompt": "Paged attention", "max_tokens": 300},
    {"messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
     "max_tokens": 3, "temperature": 0, "stop": ["\n\n"]},
    {"custom_id": "lp", "prompt": [10, 11, 12], "max_tokens": 3, "temperature": 0,
     "logprobs": 1},
]
# One thread: the tiny model gains nothing from more, and torch's CPU index_add_ can be
# very slow with several threads on a busy machine.
ENGINE_FLAGS = ["--model", "tiny-llama", "--num-kv-blocks", "16", "--max-num-seqs", "4",
                "--device", "cpu", "--num-threads", "1"]
OK_IDS = {"chat", "comp", "line-3", "line-9", "lp"}
ERROR_IDS = {"line-4", "unknown", "too-long", "too-big"}


@pytest.fixture(scope="module", autouse=True)
def _restore_torch_threads():
    """--num-threads sets a process-wide torch setting; give the next modules theirs back."""
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    yield
    torch = sys.modules.get("torch")
    if torch is not None and threads is not None:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("gen")
    inp = write_lines(tmp / "in.jsonl", MIXED)
    out = tmp / "out.jsonl"
    assert main(["generate", str(inp), "-o", str(out), "-q", *ENGINE_FLAGS]) == 0
    return inp, out, read_output(out)


def test_mixed_file_every_line_answered(mixed_run):
    _, _, rows = mixed_run
    assert set(rows) == OK_IDS | ERROR_IDS
    for cid in OK_IDS:
        assert rows[cid]["response"]["status_code"] == 200, rows[cid]
        assert rows[cid]["error"] is None
    for cid in ERROR_IDS:
        assert rows[cid]["response"]["status_code"] == 400
        assert rows[cid]["response"]["body"]["error"]["message"] == rows[cid]["error"]["message"]


def test_mixed_file_error_messages(mixed_run):
    _, _, rows = mixed_run

    def message(cid: str) -> str:
        return rows[cid]["error"]["message"]

    assert message("line-4").startswith("line 4: malformed JSON")
    assert rows["line-4"]["error"]["code"] == "invalid_json"
    assert message("unknown") == ("line 6 (custom_id 'unknown'): unknown field 'frequency' "
                                  "for /v1/completions")
    assert rows["unknown"]["response"]["body"]["error"]["param"] == "frequency"
    assert message("too-long").startswith("line 7 (custom_id 'too-long'): the prompt has 1100 "
                                          "tokens; this model's context is 1024")
    assert message("too-big").startswith("line 8 (custom_id 'too-big'): ")
    assert "needs more KV than the whole pool holds (256 tokens)" in message("too-big")


def test_mixed_file_success_shapes(mixed_run):
    _, _, rows = mixed_run
    chat = rows["chat"]["response"]["body"]
    assert chat["object"] == "chat.completion" and chat["model"] == "tiny-llama"
    assert rows["chat"]["id"].startswith("batch_req_")
    assert chat["id"] == "chatcmpl-" + rows["chat"]["response"]["request_id"]
    choice = chat["choices"][0]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"],
                                                                   str)
    assert choice["finish_reason"] in ("stop", "length")
    usage = chat["usage"]
    assert 1 <= usage["completion_tokens"] <= 6 and usage["prompt_tokens"] > 3
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    content = choice["logprobs"]["content"]
    assert len(content) == usage["completion_tokens"]
    assert all(len(c["top_logprobs"]) == 2 and c["logprob"] <= 0 for c in content)

    comp = rows["comp"]["response"]["body"]
    assert comp["object"] == "text_completion" and comp["choices"][0]["logprobs"] is None
    assert comp["usage"]["completion_tokens"] <= 5
    lp = rows["lp"]["response"]["body"]
    assert lp["usage"]["prompt_tokens"] == 3
    assert len(lp["choices"][0]["logprobs"]["token_logprobs"]) == lp["usage"]["completion_tokens"]


def test_resume_skips_written_ids_and_fills_the_rest(mixed_run, tmp_path):
    inp, _, first = mixed_run
    out = tmp_path / "out.jsonl"
    assert main(["generate", str(inp), "-o", str(out), "-q", *ENGINE_FLAGS]) == 0
    rerun = read_output(out)
    assert set(rerun) == set(first)
    # Greedy lines give the same text again.
    assert (rerun["comp"]["response"]["body"]["choices"][0]["text"]
            == first["comp"]["response"]["body"]["choices"][0]["text"])

    kept = [row for cid, row in rerun.items() if cid in {"comp", "line-4", "unknown"}]
    out.write_text("".join(json.dumps(r) + "\n" for r in kept) + '{"custom_id": "chat", "resp')
    assert main(["generate", str(inp), "-o", str(out), "-q", *ENGINE_FLAGS]) == 0
    resumed = read_output(out)  # also asserts no custom_id appears twice
    assert set(resumed) == set(first)
    for cid in ("comp", "line-4", "unknown"):
        assert resumed[cid]["id"] == rerun[cid]["id"]  # untouched

    before = out.read_text()
    assert main(["generate", str(inp), "-o", str(out), "-q", *ENGINE_FLAGS]) == 0
    assert out.read_text() == before  # nothing left to do


def test_progress_bar_and_summary(tmp_path, capsys):
    pytest.importorskip("torch")
    inp = write_lines(tmp_path / "in.jsonl", [{"prompt": "Hello", "max_tokens": 3}, "{bad"])
    out = tmp_path / "out.jsonl"
    assert main(["generate", str(inp), "-o", str(out), *ENGINE_FLAGS]) == 0
    err = capsys.readouterr().err
    assert "2/2" in err and "tok/s" in err
    assert "2 line(s) written" in err and "1 ok, 1 failed, 0 skipped" in err


def test_n_samples_become_n_choices(tmp_path) -> None:
    from cli.main import main

    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"custom_id": "multi", "prompt": "the engine", "n": 3, "max_tokens": 6,
                               "temperature": 1.0, "seed": 4, "ignore_eos": True}) + "\n")
    dst = tmp_path / "out.jsonl"
    assert main(["generate", str(src), "-o", str(dst), "--model", "tiny-llama", "-q"]) == 0
    body = json.loads(dst.read_text())["response"]["body"]
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert body["usage"]["completion_tokens"] == 18
