"""Request size: bodies past ``max_request_bytes`` get 413 before they are read whole, whether
their length is declared or not; a prompt that cannot fit the context is refused untokenized."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from guidedec import LLM
from guidedec.server import create_app

LIMIT = 1 << 20


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    llm = LLM("tiny-random", max_num_seqs=1)
    with TestClient(create_app(llm, max_request_bytes=LIMIT)) as client:
        yield client
    llm.close()


def test_a_declared_body_past_the_limit_is_413(client: TestClient) -> None:
    prompt = "word " * (LIMIT // 4)
    response = client.post("/v1/completions", json={"model": "tiny-random", "prompt": prompt})
    assert response.status_code == 413
    assert "--max-request-bytes" in response.json()["error"]["message"]
    assert client.get("/health").status_code == 200


def test_a_chunked_body_past_the_limit_is_413(client: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"model": "tiny-random", "prompt": "'
        for _ in range(4):
            yield b"x" * (LIMIT // 3)

    response = client.post(
        "/v1/completions", content=chunks(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 413


def test_a_prompt_that_cannot_fit_is_refused_before_tokenizing(client: TestClient) -> None:
    prompt = "word " * 150_000  # within the body limit, far past 4,096 tokens of any text
    response = client.post(
        "/v1/completions", json={"model": "tiny-random", "prompt": prompt, "max_tokens": 4}
    )
    assert response.status_code == 400
    assert "cannot fit the model's context" in response.json()["error"]["message"]


def test_requests_within_the_limit_are_served(client: TestClient) -> None:
    response = client.post(
        "/v1/completions", json={"model": "tiny-random", "prompt": "hello", "max_tokens": 4}
    )
    assert response.status_code == 200 and response.json()["choices"]
