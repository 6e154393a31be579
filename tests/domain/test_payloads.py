"""Payloads read back from the journal are checked as strictly as when they were
appended, except for the free-form JSON values the journal guarantees already."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shadowpod.domain.payloads import (
    PAYLOAD_MODELS,
    FactPayload,
    MessagePayload,
    read_back_model,
)

SAMPLES = {
    "message": {"role": "assistant", "content": "hi", "turn": 3, "meta": {"v": [1, {"a": None}]}},
    "tool_call": {"call_id": "c1", "tool": "weather", "args": {"city": "Oslo", "n": 2.5}},
    "tool_result": {"call_id": "c1", "status": "ok", "result": {"forecast": ["sun", 3]}},
    "memory": {"key": "name", "value": {"first": "Ada"}, "turn": 2},
    "fact": {"fact_id": "f1", "text": "metric units"},
    "state": {"values": {"count": 7, "profile": {"greeted": True}}, "schema_version": 2},
    "ack": {"turn": 3},
    "control": {"event": "epoch", "epoch": 2, "owner": "pod-b", "detail": {"why": "upgrade"}},
}


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_a_payload_reads_back_as_it_was_appended(kind: str) -> None:
    model = PAYLOAD_MODELS[kind]
    strict = model.model_validate(SAMPLES[kind])
    read_back = read_back_model(model).model_validate(SAMPLES[kind])
    assert isinstance(read_back, model)
    assert read_back.model_dump() == strict.model_dump()
    assert read_back.model_fields_set == strict.model_fields_set


@pytest.mark.parametrize(
    "payload",
    [
        {"role": "robot", "content": "hi"},  # not a role
        {"role": "user"},  # no content
        {"role": "user", "content": "hi", "turn": 0},  # turns are seqs, from 1
        {"role": "user", "content": "hi", "colour": "blue"},  # unknown field
        {"role": "user", "content": "hi", "meta": ["not", "an", "object"]},
    ],
)
def test_what_the_strict_model_refuses_is_still_refused(payload: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        MessagePayload.model_validate(payload)
    with pytest.raises(ValidationError):
        read_back_model(MessagePayload).model_validate(payload)


def test_a_model_without_free_form_values_is_used_as_it_is() -> None:
    assert read_back_model(FactPayload) is FactPayload
    assert read_back_model(MessagePayload) is not MessagePayload
