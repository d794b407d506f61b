"""LangChain's ChatOpenAI / OpenAI and litellm against `jaxllm serve` on the default model: invoke, stream, batch,
logprobs and plain completions, each printed with what came back.

    pip install langchain-openai litellm      # not test dependencies (litellm warns it cannot fetch prices offline)
    python benchmarks/client_compat.py [--port 8311]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import httpx

MODEL = "SmolLM2-135M-Instruct"


def start_server(port: int) -> subprocess.Popen:
    server = subprocess.Popen([sys.executable, "-m", "jaxllm.entrypoints.cli", "serve", "--port", str(port),
                               "--no-warmup", "--max-model-len", "1024", "--log-level", "warning"])
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.5)
    server.kill()
    raise RuntimeError("the server did not become healthy")


def langchain_checks(base_url: str) -> dict:
    from langchain_openai import ChatOpenAI, OpenAI

    chat = ChatOpenAI(model=MODEL, base_url=base_url, api_key="unused", max_tokens=12, temperature=0)
    reply = chat.invoke("What is the capital of France?")
    with_logprobs = ChatOpenAI(model=MODEL, base_url=base_url, api_key="unused", max_tokens=3, temperature=0,
                               logprobs=True, top_logprobs=2).invoke("Hi")
    return {
        "langchain chat invoke": (reply.content, reply.response_metadata.get("finish_reason")),
        "langchain chat stream": "".join(chunk.content for chunk in chat.stream("Name a colour.")),
        "langchain chat batch": [message.content for message in chat.batch(["Hi", "Hello"])],
        "langchain chat logprobs": len(with_logprobs.response_metadata["logprobs"]["content"]),
        "langchain completions": OpenAI(model=MODEL, base_url=base_url, api_key="unused", max_tokens=8,
                                        temperature=0).invoke("The capital of France is"),
    }


def litellm_checks(base_url: str) -> dict:
    import litellm

    options = dict(model=f"openai/{MODEL}", api_base=base_url, api_key="unused", max_tokens=8)
    messages = [{"role": "user", "content": "Hi"}]
    reply = litellm.completion(messages=messages, temperature=0, **options)
    stream = litellm.completion(messages=messages, stream=True, **options)
    return {
        "litellm completion": (reply.choices[0].message.content, reply.usage.total_tokens),
        "litellm stream": "".join(chunk.choices[0].delta.content or "" for chunk in stream),
        "litellm text_completion": litellm.text_completion(prompt="Once upon", **options).choices[0].text,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8311)
    args = parser.parse_args()
    server = start_server(args.port)
    try:
        base_url = f"http://127.0.0.1:{args.port}/v1"
        for name, result in {**langchain_checks(base_url), **litellm_checks(base_url)}.items():
            print(f"{name}: {result!r}")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
