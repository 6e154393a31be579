"""Properties of the gateway's edge (hypothesis):

- every bounded number a request carries — in a body or in the query — is taken
  exactly within its bounds and refused, naming its field, outside them or when it is
  not an integer;
- the fence guarantee through the gateway's own routes: whatever the sequence of
  ownership changes, ExchangeFences, unfences and owner writes, a write at an epoch
  older than the current one is refused (409 ``Fenced``), the epoch never goes down
  and a new owner always comes with a larger epoch. A real gateway over HTTP, on a
  SQLite journal.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, ClassVar, Final

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from pydantic import BaseModel, ValidationError

from shadowpod.api import models
from shadowpod.domain.bounds import INT32_MAX, INT64_MAX
from shadowpod.gateway.context import parse_int
from shadowpod.gateway.errors import ApiError
from tests.gateway.conftest import CONTROL
from tests.gateway.threaded import Gateway

# (model, the rest of a valid body, field, smallest allowed, largest allowed)
BOUNDED: Final[list[tuple[type[BaseModel], dict[str, Any], str, int, int]]] = [
    (models.AppendRequest, {"entries": []}, "epoch", 1, INT64_MAX),
    (models.AppendRequest, {"epoch": 1, "entries": []}, "after", 0, INT64_MAX),
    (models.AckRequest, {"turn": 1}, "epoch", 1, INT64_MAX),
    (models.AckRequest, {"epoch": 1}, "turn", 1, INT64_MAX),
    (models.OwnershipChange, {"epoch": 1, "owner": "a"}, "expect_epoch", 0, INT64_MAX),
    (models.OwnershipChange, {"expect_epoch": 0, "owner": "a"}, "epoch", 1, INT64_MAX),
    # A fence moves the session to expect_epoch + 1, which must be an epoch too.
    (models.FenceRequest, {"new_owner": "a"}, "expect_epoch", 1, INT64_MAX - 1),
    (models.UnfenceRequest, {}, "expect_epoch", 0, INT64_MAX),
    (models.DrainReport, {"instance": "a"}, "epoch", 1, INT64_MAX),
    (models.ProcessReport, {"name": "p", "outcome": "exited"}, "pid", 1, INT32_MAX),
    (models.ProcessReport, {"name": "p", "outcome": "exited"}, "exit_code", -(2**31), 2**32 - 1),
]
CASES: Final = [pytest.param(*c, id=f"{c[0].__name__}.{c[2]}") for c in BOUNDED]


def _refused_at(model: type[BaseModel], body: dict[str, Any]) -> list[str]:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(body)
    return [".".join(str(p) for p in e["loc"]) for e in caught.value.errors()]


@pytest.mark.parametrize(("model", "base", "field", "low", "high"), CASES)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_a_body_integer_is_taken_exactly_within_its_bounds(
    data: st.DataObject,
    model: type[BaseModel],
    base: dict[str, Any],
    field: str,
    low: int,
    high: int,
) -> None:
    value = data.draw(st.integers(low - 2**65, high + 2**65) | st.sampled_from([low, high]))
    body = {**base, field: value}
    if low <= value <= high:
        assert getattr(model.model_validate(body), field) == value
    else:
        assert _refused_at(model, body) == [field]


@pytest.mark.parametrize(("model", "base", "field", "low", "high"), CASES)
@settings(max_examples=20, deadline=None)
@given(
    odd=st.booleans()
    # An integer-valued number is the integer (JSON Schema's reading): not odd.
    | st.floats(allow_nan=True).filter(lambda f: not f.is_integer())
    | st.text(max_size=5)
    | st.lists(st.integers(), max_size=2)
)
def test_a_body_integer_refuses_what_is_not_an_integer(
    model: type[BaseModel], base: dict[str, Any], field: str, low: int, high: int, odd: object
) -> None:
    assert _refused_at(model, {**base, field: odd}) == [field]


@settings(max_examples=300, deadline=None)
@given(
    raw=st.text(max_size=25)
    | st.integers(-(2**70), 2**70).map(str)
    | st.from_regex(r"[0-9\u0660-\u0669\u00b2_ +-]{1,22}", fullmatch=True),
    maximum=st.sampled_from([INT64_MAX, INT32_MAX, 100]),
)
def test_a_query_integer_is_ascii_digits_within_its_bounds(raw: str, maximum: int) -> None:
    if raw.isascii() and raw.isdigit() and 1 <= int(raw) <= maximum:
        assert parse_int(raw, "after", minimum=1, maximum=maximum) == int(raw)
    else:
        with pytest.raises(ApiError) as refused:
            parse_int(raw, "after", minimum=1, maximum=maximum)
        assert refused.value.status == 400
        assert [e.loc for e in refused.value.errors] == ["after"]


# --- the fence guarantee through the gateway -------------------------------------------

OWNERS: Final = st.sampled_from(["pod-a", "pod-b", "pod-c"])
_names = itertools.count()


class FenceThroughTheGateway(RuleBasedStateMachine):
    gateway: ClassVar[Gateway]
    http: ClassVar[requests.Session]

    def __init__(self) -> None:
        super().__init__()
        self.session = f"prop-{next(_names)}"
        created = self.call("POST", "/v1/sessions", json={"session": self.session})
        assert created.status_code == 201, created.text
        self.agent = created.json()["agent_token"]
        self.epoch = 0  # the session's epoch as last read back
        self.owner: str | None = None

    def call(
        self, method: str, path: str, *, token: str = CONTROL, **kwargs: Any
    ) -> requests.Response:
        return self.http.request(
            method,
            self.gateway.url + path,
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
            **kwargs,
        )

    @rule(
        expect_offset=st.sampled_from([0, 0, 0, -1, 1]),
        bump=st.sampled_from([0, 1, 1, 2, -1]),
        owner=OWNERS,
    )
    def put_ownership(self, expect_offset: int, bump: int, owner: str) -> None:
        expect, epoch = self.epoch + expect_offset, self.epoch + bump
        body = {"expect_epoch": expect, "epoch": epoch, "owner": owner}
        answer = self.call("PUT", f"/v1/sessions/{self.session}/ownership", json=body)
        if expect < 0 or epoch < 1:
            assert answer.status_code == 400, answer.text  # out of the fields' bounds
        elif expect_offset or bump < 0 or (bump == 0 and owner != self.owner):
            assert 400 <= answer.status_code < 500, answer.text  # refused, and says why
        else:
            assert answer.status_code == 200, answer.text
        self._is_json(answer)

    @rule(new_owner=OWNERS)
    def fence(self, new_owner: str) -> None:
        body = {"expect_epoch": self.epoch, "new_owner": new_owner, "timeout_s": 0.2}
        answer = self.call("POST", f"/v1/sessions/{self.session}/fence", json=body)
        if self.epoch < 1:
            assert answer.status_code == 400, answer.text  # there is no owner to fence
        else:
            assert answer.status_code == 200, answer.text
            assert answer.json()["epoch"] > self.epoch
        self._is_json(answer)

    @rule()
    def unfence(self) -> None:
        body = {"expect_epoch": self.epoch}
        answer = self.call("POST", f"/v1/sessions/{self.session}/unfence", json=body)
        assert answer.status_code == 200, answer.text

    @rule(offset=st.sampled_from([0, 0, -1, -2, 1]))
    def owner_writes(self, offset: int) -> None:
        epoch = self.epoch + offset
        body = {
            "epoch": epoch,
            "entries": [{"kind": "memory", "payload": {"key": "k", "value": epoch}}],
        }
        answer = self.call(
            "POST", f"/v1/sessions/{self.session}/journal", token=self.agent, json=body
        )
        self._is_json(answer)
        if epoch < 1:
            assert answer.status_code == 400, answer.text
        elif epoch != self.epoch:  # an older epoch above all: refused
            assert answer.status_code == 409, answer.text
            assert answer.json()["reason"] == "Fenced"
        else:
            assert answer.status_code == 200, answer.text

    @invariant()
    def a_new_owner_comes_with_a_larger_epoch(self) -> None:
        record = self.call("GET", f"/v1/sessions/{self.session}/ownership").json()
        assert record["epoch"] >= self.epoch  # never down
        if record["owner"] != self.owner:
            assert record["epoch"] > self.epoch
        self.epoch, self.owner = record["epoch"], record["owner"]

    def teardown(self) -> None:
        """In the journal, no owner entry of an epoch follows the marker of a later one."""
        page = self.call(
            "GET",
            f"/v1/sessions/{self.session}/journal",
            token=self.agent,
            params={"limit": 10_000},
        ).json()
        latest = 0
        for entry in page["entries"]:
            if entry["kind"] == "control" and entry["payload"].get("event") == "epoch":
                assert entry["payload"]["epoch"] > latest
                latest = entry["payload"]["epoch"]
            elif entry["epoch"]:
                assert entry["epoch"] == latest, "an owner wrote after its epoch was replaced"

    @staticmethod
    def _is_json(answer: requests.Response) -> None:
        assert answer.headers["Content-Type"].startswith("application/json")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    journal = tmp_path_factory.mktemp("properties") / "j.db"
    with Gateway(journal, "unused") as running:
        yield running


def test_the_fence_guarantee_holds_through_the_gateway(gateway: Gateway) -> None:
    with requests.Session() as http:
        machine = type("Machine", (FenceThroughTheGateway,), {"gateway": gateway, "http": http})
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=25,
                stateful_step_count=12,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                database=None,
            ),
        )
