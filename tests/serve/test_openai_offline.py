"""The OpenAI frontend's pieces that need no server: request validation, response shapes, settings, the
trtllm-serve command (facts from TensorRT-LLM's serve.py and openai_server.py, cited in serve/openai/trtllm.py)."""

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("pydantic")

from trtllm_dflash.serve.openai.protocol import ChatRequest, CompletionRequest, InvalidRequest, parse_body  # noqa: E402
from trtllm_dflash.serve.openai.responses import Final, Shape  # noqa: E402
from trtllm_dflash.utils.errors import DFlashError  # noqa: E402


def parse(model, body: dict):
    return parse_body(model, json.dumps(body).encode(), "dflash")


def refused(model, body: dict) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as err:
        parse(model, body)
    return err.value


def test_what_clients_send_is_accepted_with_openai_defaults():
    # AIPerf 0.13 completions, vLLM's and SGLang's bench clients send these shapes
    req = parse(CompletionRequest, {"model": "dflash", "prompt": ["one prompt"], "stream": True, "max_tokens": 8,
                                    "stream_options": {"include_usage": True}, "ignore_eos": True, "logprobs": None,
                                    "best_of": 1, "temperature": 0.0, "n": 1})
    assert (req.prompt, req.include_usage, req.ignore_eos, req.top_k) == ("one prompt", True, True, 0)
    default = parse(CompletionRequest, {"model": "dflash", "prompt": "x"})
    assert (default.max_tokens, default.temperature, default.top_p, default.stream) == (16, 1.0, 1.0, False)
    chat = parse(ChatRequest, {"model": "dflash", "max_completion_tokens": 5, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]})
    assert chat.messages[0].as_template_input() == {"role": "user", "content": "ab"} and chat.output_limit == 5


@pytest.mark.parametrize("model, body, param, needle", [
    (CompletionRequest, {"prompt": "x"}, "model", "'model' is required"),
    (CompletionRequest, {"model": "dflash", "prompt": "x", "max_tokens": "8"}, "max_tokens",
     "'max_tokens': Input should be a valid integer (got '8')"),
    (CompletionRequest, {"model": "dflash", "prompt": "x", "ignore_eos": 1}, "ignore_eos", "valid boolean"),
    (CompletionRequest, {"model": "dflash", "prompt": "x", "top_p": 0}, "top_p", "greater than 0"),
    (CompletionRequest, {"model": "dflash", "prompt": ""}, "prompt", "the prompt is an empty string"),
    (CompletionRequest, {"model": "dflash", "prompt": ["a", "b"]}, "prompt", "one prompt per request"),
    (CompletionRequest, {"model": "dflash", "prompt": "x", "echo": True}, "echo", "echo=True is not supported"),
    (CompletionRequest, {"model": "dflash", "prompt": "x", "stop": ""}, "stop", "empty string"),
    (CompletionRequest, {"model": "dflash", "prompt": "x", "presence_penalty": 0.5}, "presence_penalty",
     "presence_penalty=0.5 is not supported"),
    (ChatRequest, {"model": "dflash", "messages": [{"role": "tool", "content": "x"}]}, "messages.0.role",
     "'system', 'developer', 'user' or 'assistant'"),
    (ChatRequest, {"model": "dflash", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages.0.content", "text only"),
    (ChatRequest, {"model": "dflash", "messages": [{"role": "user", "content": "x"}], "tools": [{}]}, "tools",
     "is not supported"),
    (ChatRequest, {"model": "dflash", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
                   "max_completion_tokens": 5}, "max_completion_tokens", "disagree"),
    (ChatRequest, {"model": "dflash", "messages": [{"role": "user", "content": "x"}],
                   "response_format": {"type": "json_object"}}, "response_format.type", "Input should be 'text'"),
])
def test_refusals_name_the_parameter(model, body, param, needle):
    err = refused(model, body)
    assert err.status == 400 and err.param == param and needle in err.message, err.message


def test_several_problems_are_one_line_that_counts_them():
    err = refused(CompletionRequest, {"model": "dflash", "prompt": "x", "a": 1, "b": 2})
    assert err.message == "unknown field 'a'; and 1 more problem"


def test_usage_carries_server_counts_and_the_dflash_extension():
    final = Final("length", 11, 20, 4, 28, 15, )
    assert final.usage() == {"prompt_tokens": 11, "completion_tokens": 20, "total_tokens": 31, "dflash": {
        "draft_steps": 4, "drafted_tokens": 28, "accepted_tokens": 15, "acceptance_length": 1 + 15 / 4}}
    assert Final("stop", 3, 5, 0, 0, 0).usage()["dflash"]["acceptance_length"] is None  # plain decoding
    chat = Shape("dflash", chat=True)
    assert chat.whole("hi", final)["choices"][0]["message"] == {"role": "assistant", "content": "hi"}
    assert chat.chunk(None, role=True)["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chat.usage_chunk(final)["choices"] == [] and chat.id.startswith("chatcmpl-")
    assert Shape("dflash", chat=False).chunk("a", "stop")["object"] == "text_completion"


def test_frontend_settings_fail_before_anything_starts(tmp_path):
    from trtllm_dflash.serve.openai.server import FrontendSettings, listen

    with pytest.raises(DFlashError, match="--openai-port must be in 1..65535, got 0"):
        FrontendSettings("e", "127.0.0.1:1", "dflash", port=0)
    with pytest.raises(DFlashError, match="no such file"):
        FrontendSettings("e", "127.0.0.1:1", "dflash", port=9, chat_template=str(tmp_path / "none.jinja"))
    (tmp_path / "bad.jinja").write_text("{% for m in messages %}")
    with pytest.raises(DFlashError, match=r"bad.jinja: not a valid Jinja template \(line 1"):
        FrontendSettings("e", "127.0.0.1:1", "dflash", port=9, chat_template=str(tmp_path / "bad.jinja"))
    taken = listen("127.0.0.1", 0)
    port = taken.getsockname()[1]
    with pytest.raises(DFlashError, match=f"--openai-port {port}: cannot listen on 127.0.0.1:{port} "
                                          r"\(address already in use\)"):
        listen("127.0.0.1", port)
    taken.close()


def test_chat_template_missing_is_a_400_naming_it():
    from trtllm_dflash.serve.openai.chat import ChatTemplate

    class NoTemplate:
        chat_template = None

    with pytest.raises(InvalidRequest, match="this model has no chat template.*--chat-template FILE"):
        ChatTemplate(NoTemplate()).render([{"role": "user", "content": "hi"}])


def test_trtllm_engines_get_trtllm_serve_under_the_same_model_name(builtin, engine_factory, tmp_path, capsys, monkeypatch):
    """dflash-serve --openai-port on a trtllm engine prints trtllm-serve's command; where TensorRT-LLM is
    absent it says so in one line."""
    from trtllm_dflash.cli.serve import main as serve_main

    engine = engine_factory.get(*builtin, backend="trtllm", tp=2)
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable))  # no trtllm-serve here
    argv = [str(engine), "--model-repo", str(tmp_path / "repo"), "--openai-port", "9100", "--model-name", "mymodel"]
    assert serve_main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    link = tmp_path / ".dflash-openai" / "mymodel"
    line = next(x for x in err if x.startswith("OpenAI API (TensorRT-LLM): "))
    assert line.split(": ", 1)[1].split() == [
        "trtllm-serve", str(link), "--backend", "pytorch", "--tp_size", "2", "--config",
        f"{link}.llm_options.yaml", "--host", "127.0.0.1", "--port", "9100"]
    options = yaml.safe_load(Path(f"{link}.llm_options.yaml").read_text())  # absolute: trtllm-serve runs anywhere
    assert options["speculative_config"]["speculative_model"] == str(engine / "drafter")
    assert link.resolve() == (engine / "target").resolve()  # trtllm-serve serves it as model 'mymodel'
    assert err[-1] == ("dflash-serve: error: trtllm-serve is not on PATH: run the command above inside the "
                       "TensorRT-LLM container (it serves the OpenAI API of trtllm engines)")
    assert serve_main(argv + ["--write-only"]) == 0  # prints the command only; the link is reused
    assert serve_main(argv[:-2] + ["--chat-template", str(tmp_path / "none")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert serve_main(argv + ["--api-key", "sk-1"]) == 2  # TensorRT-LLM's serve.py has no API key option
    assert capsys.readouterr().err.splitlines()[-1].startswith("dflash-serve: error: --api-key: trtllm-serve, the "
                                                               "OpenAI API of trtllm engines, takes no API key")
    assert serve_main([str(engine), "--write-only", "--api-key", "sk-1"]) == 2
    assert capsys.readouterr().err.strip() == ("dflash-serve: error: --api-key is for the OpenAI API: give "
                                               "--openai-port too")


class ByteTokenizer:
    """A token a UTF-8 byte, as the test pair's tokenizer: token counts are byte counts."""

    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode())


KEY = "sk-test-0123456789"


@pytest.fixture(scope="module")
def app_client():
    """The app with an API key and small limits, no Triton behind it (requests refused before it are answered)."""
    testclient = pytest.importorskip("starlette.testclient")
    from trtllm_dflash.serve.openai.app import Frontend, create_app
    from trtllm_dflash.serve.openai.chat import ChatTemplate

    tokenizer = ByteTokenizer()
    frontend = Frontend("dflash", "127.0.0.1:9", tokenizer, ChatTemplate(tokenizer), max_seq_len=64, block_size=8,
                        max_request_bytes=4096)
    with testclient.TestClient(create_app(frontend, KEY)) as client:
        yield client


def test_every_route_but_health_needs_the_api_key(app_client):
    auth = {"Authorization": f"Bearer {KEY}"}
    assert app_client.get("/v1/models", headers=auth).status_code == 200
    assert app_client.get("/v1/models", headers={"Authorization": f"bearer {KEY}"}).status_code == 200
    assert app_client.get("/nowhere", headers=auth).status_code == 404
    refusals = [app_client.get("/v1/models"), app_client.get("/nowhere"),
                app_client.post("/v1/completions", json={"model": "dflash", "prompt": "hi"}),
                app_client.post("/v1/chat/completions", headers={"Authorization": "Bearer sk-test-012345678"}),
                app_client.get("/v1/models", headers={"Authorization": f"Basic {KEY}"}),
                app_client.post("/v1/completions", content=b"x" * 8192)]  # refused before the body (no 413)
    for reply in refusals:
        error = reply.json()["error"]
        assert reply.status_code == 401 and reply.headers["WWW-Authenticate"] == "Bearer", reply.text
        assert error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key"
        assert KEY[:12] not in reply.text  # neither the key nor the one sent is echoed
    assert [r.json()["error"]["message"] for r in refusals[2:5]] == [
        "missing API key: send the header 'Authorization: Bearer KEY'", "invalid API key",
        "the Authorization header must be 'Bearer KEY'"]
    assert app_client.get("/health").status_code == 503  # open: no key asked; no Triton behind it, so not ready


@pytest.mark.parametrize("body, status, needle", [
    ({"prompt": "x" * 60}, 400, "the prompt is 60 tokens: this engine holds at most 55 tokens of prompt and output "
                                "(max_seq_len 64 less 9 positions for drafting), so none are left to generate"),
    ({"prompt": "x" * 10, "max_tokens": 50}, 400, "'max_tokens': at most 45 after this prompt of 10 tokens"),
    ({"prompt": "x", "stop": ["y" * 257]}, 400, "a stop sequence is at most 256 characters, got one of 257"),
    ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "at most 4 stop sequences, got 5"),
    ({"prompt": "x", "n": 3}, 400, "n=3 is not supported by this server"),
    ({"prompt": "x", "logprobs": 1}, 400, "logprobs=1 is not supported"),
    ({"prompt": "x", "user": "u" * 5000}, 413, "the request body is {size} bytes: this server accepts at most 4096 "
                                                "(dflash-serve --max-request-bytes)"),
])
def test_limits_are_refused_naming_the_value(app_client, body, status, needle):
    content = json.dumps({"model": "dflash", **body}).encode()
    reply = app_client.post("/v1/completions", content=content, headers={"Authorization": f"Bearer {KEY}"})
    error = reply.json()["error"]
    assert reply.status_code == status and needle.format(size=len(content)) in error["message"], reply.text
    assert error["type"] == "invalid_request_error" and "\n" not in error["message"]


def test_a_chunked_or_deeply_nested_body_is_refused(app_client):
    auth = {"Authorization": f"Bearer {KEY}"}
    chunked = app_client.post("/v1/completions", content=iter([b" " * 3000] * 2), headers=auth)  # no Content-Length
    assert chunked.status_code == 413 and "is more than 4096 bytes" in chunked.json()["error"]["message"]
    with pytest.raises(InvalidRequest, match="the body's JSON nests too deeply"):  # RecursionError, not a 500
        parse_body(CompletionRequest, b"[" * 100_000 + b"]" * 100_000, "dflash")


def test_frontend_settings_check_the_key_and_the_body_limit():
    from trtllm_dflash.serve.openai.server import FrontendSettings

    with pytest.raises(DFlashError, match="must be printable ASCII without spaces") as err:
        FrontendSettings("e", "127.0.0.1:1", "dflash", port=9, api_key="two words")
    assert "two words" not in str(err.value)
    with pytest.raises(DFlashError, match="--max-request-bytes must be at least 1024, got 10"):
        FrontendSettings("e", "127.0.0.1:1", "dflash", port=9, max_request_bytes=10)
    assert "sk-" not in repr(FrontendSettings("e", "127.0.0.1:1", "dflash", port=9, api_key="sk-secret"))
