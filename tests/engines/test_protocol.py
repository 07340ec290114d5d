"""The typed SGLang protocol against fixtures written from SGLang 0.5.23's source."""

from __future__ import annotations

import numpy as np
import pytest

from dressage.engines.protocol import (
    GenerateRequest,
    GenerateResponse,
    SamplingParams,
    decode_routed_experts,
    encode_routed_experts,
    sse_event,
)

# Shape of a non-streaming /generate answer as tokenizer_manager.py builds it (BatchStrOutput path).
SGLANG_RESPONSE = {
    "text": "Hi",
    "output_ids": [13048, 248046],
    "meta_info": {
        "id": "rid-1",
        "finish_reason": {"type": "stop", "matched": 248046},
        "prompt_tokens": 5,
        "weight_version": "3",
        "num_retractions": 0,
        "output_token_logprobs": [[-0.25, 13048, None], [-0.01, 248046, None]],
        "reasoning_tokens": 0,
        "completion_tokens": 2,
        "cached_tokens": 4,
        "weight_versions": [{"version": "2", "start": 0, "end": 1}, {"version": "3", "start": 1, "end": 2}],
        "e2e_latency": 0.1,
    },
}


def test_response_fixture_parses() -> None:
    r = GenerateResponse.model_validate(SGLANG_RESPONSE)
    assert r.meta_info.finish_reason is not None and r.meta_info.finish_reason.matched == 248046
    assert [e[1] for e in r.meta_info.output_token_logprobs or []] == r.output_ids
    assert [s.version for s in r.meta_info.weight_versions or []] == ["2", "3"]


def test_abort_finish_reason_parses() -> None:
    meta = dict(
        SGLANG_RESPONSE["meta_info"],
        finish_reason={"type": "abort", "message": "Abort request", "status_code": None, "err_type": None},
    )
    r = GenerateResponse.model_validate(dict(SGLANG_RESPONSE, meta_info=meta))
    assert r.meta_info.finish_reason is not None and r.meta_info.finish_reason.type == "abort"


def test_request_body_uses_sglang_names() -> None:
    body = GenerateRequest(
        rid="r",
        input_ids=[1, 2],
        sampling_params=SamplingParams(temperature=0, sampling_seed=3, stop_token_ids=[7]),
        return_logprob=True,
    ).to_body()
    assert body["sampling_params"] == {
        "max_new_tokens": 128,
        "temperature": 0.0,
        "stop_token_ids": [7],
        "sampling_seed": 3,
    }
    assert body["rid"] == "r" and body["input_ids"] == [1, 2] and body["return_logprob"] is True


def test_routed_experts_roundtrip() -> None:
    experts = np.arange(5 * 3 * 2, dtype=np.int32).reshape(5, 3, 2)
    assert np.array_equal(decode_routed_experts(encode_routed_experts(experts), 3, 2), experts)
    with pytest.raises(ValueError):
        decode_routed_experts(encode_routed_experts(experts), 4, 2)


def test_sse_framing() -> None:
    assert sse_event("[DONE]") == b"data: [DONE]\n\n"
    assert sse_event({"a": 1}) == b'data: {"a":1}\n\n'


def test_body_accepted_by_sglang_itself() -> None:
    io_struct = pytest.importorskip(
        "sglang.srt.managers.io_struct",
        # Tried with `pip install --no-deps sglang==0.5.23`: io_struct imports schedule_batch,
        # which needs triton, torchvision and tvm_ffi (not on these machines' package index).
        reason="sglang's io_struct does not import here (it pulls its GPU runtime: triton, tvm_ffi)",
    )
    body = GenerateRequest(
        rid="r", input_ids=[1, 2], return_logprob=True, return_routed_experts=True
    ).to_body()
    req = io_struct.GenerateReqInput(**body)
    assert req.input_ids == [1, 2]
