"""The LangGraph checkpointer's value codec: chat messages journaled without the fields
that hold their defaults read back as the messages they were, and what journals
written before (LangChain's whole dict form) hold still reads back the same."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    message_to_dict,
    messages_from_dict,
)
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from shadowpod.integrations.langgraph.codec import ValueCodec

CODEC = ValueCodec(JsonPlusSerializer())

texts = st.text(max_size=12)
ids = st.none() | st.text(min_size=1, max_size=8)
json_scalars = st.none() | st.booleans() | st.integers(-5, 5) | texts
small_dicts = st.dictionaries(st.text(min_size=1, max_size=5), json_scalars, max_size=2)
contents = texts | st.lists(
    st.fixed_dictionaries({"type": st.just("text"), "text": texts}), max_size=2
)
tool_calls = st.lists(
    st.builds(
        lambda name, args, call_id: {"name": name, "args": args, "id": call_id},
        st.text(min_size=1, max_size=6),
        small_dicts,
        st.text(min_size=1, max_size=6),
    ),
    max_size=2,
)
usage = st.none() | st.builds(
    lambda i, o: {"input_tokens": i, "output_tokens": o, "total_tokens": i + o},
    st.integers(0, 99),
    st.integers(0, 99),
)
common: dict[str, Any] = {
    "content": contents,
    "id": ids,
    "name": st.none() | st.text(min_size=1, max_size=5),
    "additional_kwargs": small_dicts,
    "response_metadata": small_dicts,
}
messages = st.one_of(
    st.builds(HumanMessage, **common),
    st.builds(SystemMessage, **common),
    st.builds(AIMessage, tool_calls=tool_calls, usage_metadata=usage, **common),
    st.builds(
        ToolMessage,
        tool_call_id=st.text(min_size=1, max_size=6),
        status=st.sampled_from(["success", "error"]),
        artifact=st.none() | small_dicts,
        **common,
    ),
)


def _whole(message: BaseMessage) -> BaseMessage:
    """The message after LangChain's own round trip through its dict form."""
    return messages_from_dict([message_to_dict(message)])[0]


@settings(max_examples=300, deadline=None)
@given(messages)
def test_a_message_reads_back_as_it_was_written(message: BaseMessage) -> None:
    encoded = CODEC.encode(message)
    # What the journal holds is JSON: read back from its bytes, as a new owner does.
    decoded = CODEC.decode(orjson.loads(orjson.dumps(encoded)))
    assert type(decoded) is type(message)
    assert decoded == _whole(message)
    assert decoded.model_dump() == _whole(message).model_dump()


@settings(max_examples=100, deadline=None)
@given(messages)
def test_a_message_journaled_whole_before_still_reads_back(message: BaseMessage) -> None:
    written_before = {"$message": message_to_dict(message)}
    assert CODEC.decode(written_before) == CODEC.decode(CODEC.encode(message))


def test_a_plain_chat_message_is_journaled_without_its_defaults() -> None:
    reply = AIMessage(content="you said: hi (1 messages so far)", id="run-1")
    encoded = CODEC.encode(reply)
    assert encoded == {
        "$message": {
            "type": "ai",
            "data": {"content": "you said: hi (1 messages so far)", "id": "run-1"},
        }
    }
    whole = {"$message": message_to_dict(reply)}
    assert len(orjson.dumps(encoded)) * 2 < len(orjson.dumps(whole))
