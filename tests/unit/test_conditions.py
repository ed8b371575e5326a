"""declop.conditions: the cases of apimachinery's pkg/api/meta/conditions_test.go, on plain dicts,
plus the parts a dict model adds (missing fields, validation, timestamps)."""

from __future__ import annotations

import datetime

import pytest

from declop import conditions

HOUR_BEFORE = "2026-01-01T11:00:00Z"
HOUR_AFTER = "2026-01-01T13:00:00Z"


def utc_now_seconds() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)


def parse(ts: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(ts)


# -- SetStatusCondition ---------------------------------------------------------------------


def test_should_add_at_the_end_with_the_supplied_time():
    conds = [{"type": "first"}, {"type": "third"}]
    changed = conditions.set(
        conds, "second", "True", reason="Reason", message="message", last_transition_time=HOUR_BEFORE
    )
    assert changed is True
    assert conds == [
        {"type": "first"},
        {"type": "third"},
        {"type": "second", "status": "True", "reason": "Reason", "message": "message", "lastTransitionTime": HOUR_BEFORE},
    ]


def test_use_supplied_time_when_the_status_changes():
    conds = [{"type": "first"}, {"type": "second", "status": "False", "reason": "Old", "message": "", "lastTransitionTime": HOUR_AFTER}, {"type": "third"}]
    changed = conditions.set(
        conds, "second", "True", reason="Reason", message="message", last_transition_time=HOUR_BEFORE
    )
    assert changed is True
    assert conds == [
        {"type": "first"},
        {"type": "second", "status": "True", "reason": "Reason", "message": "message", "lastTransitionTime": HOUR_BEFORE},
        {"type": "third"},
    ]


def test_update_fields_keeps_the_time_when_the_status_stays():
    conds = [{"type": "first"}, {"type": "second", "status": "True", "reason": "Old", "message": "", "lastTransitionTime": HOUR_BEFORE}, {"type": "third"}]
    changed = conditions.set(
        conds, "second", "True", reason="Reason", message="message", observed_generation=3,
        last_transition_time=HOUR_AFTER,
    )
    assert changed is True
    assert conds[1] == {
        "type": "second", "status": "True", "reason": "Reason", "message": "message",
        "observedGeneration": 3, "lastTransitionTime": HOUR_BEFORE,
    }
    assert conds[0] == {"type": "first"} and conds[2] == {"type": "third"}


def test_nothing_changes():
    conds = [{"type": "type", "status": "True", "reason": "Same", "message": "", "lastTransitionTime": HOUR_BEFORE}]
    before = [dict(c) for c in conds]
    assert conditions.set(conds, "type", "True", reason="Same", last_transition_time=HOUR_BEFORE) is False
    assert conds == before


def test_an_unchanged_status_without_a_supplied_time_keeps_the_old_time():
    conds = [{"type": "Ready", "status": "True", "reason": "Available", "message": "ok", "observedGeneration": 4, "lastTransitionTime": HOUR_BEFORE}]
    assert conditions.set(conds, "Ready", True, reason="Available", message="ok", observed_generation=4) is False
    assert conds[0]["lastTransitionTime"] == HOUR_BEFORE


@pytest.mark.parametrize("field, value", [("reason", "Other"), ("message", "other"), ("observed_generation", 5)])
def test_each_field_alone_is_a_change_that_keeps_the_time(field, value):
    conds = [{"type": "Ready", "status": "True", "reason": "Available", "message": "ok", "observedGeneration": 4, "lastTransitionTime": HOUR_BEFORE}]
    given = {"reason": "Available", "message": "ok", "observed_generation": 4, field: value}
    assert conditions.set(conds, "Ready", "True", **given) is True
    assert conds[0]["lastTransitionTime"] == HOUR_BEFORE
    key = {"observed_generation": "observedGeneration"}.get(field, field)
    assert conds[0][key] == value


def test_a_status_change_without_a_supplied_time_moves_it_to_now():
    conds = [{"type": "Ready", "status": "False", "reason": "Progressing", "message": "", "lastTransitionTime": HOUR_BEFORE}]
    lower = utc_now_seconds()
    assert conditions.set(conds, "Ready", True, reason="Available") is True
    upper = utc_now_seconds()
    moved = conds[0]["lastTransitionTime"]
    assert moved.endswith("Z") and len(moved) == len("2026-01-01T00:00:00Z")  # whole seconds, UTC
    assert lower <= parse(moved) <= upper
    assert conds[0]["status"] == "True"


def test_a_new_condition_without_a_supplied_time_gets_now():
    conds: list[dict] = []
    lower = utc_now_seconds()
    conditions.set(conds, "Ready", "Unknown", reason="Starting")
    assert lower <= parse(conds[0]["lastTransitionTime"]) <= utc_now_seconds()
    assert conds == [{"type": "Ready", "status": "Unknown", "reason": "Starting", "message": "", "lastTransitionTime": conds[0]["lastTransitionTime"]}]


def test_a_missing_transition_time_is_set_even_when_the_status_stays():
    conds = [{"type": "Ready", "status": "True", "reason": "Available", "message": ""}]
    assert conditions.set(conds, "Ready", True, reason="Available", last_transition_time=HOUR_BEFORE) is True
    assert conds[0]["lastTransitionTime"] == HOUR_BEFORE


def test_leaving_out_the_generation_removes_it_and_zero_is_the_same_as_absent():
    conds = [{"type": "Ready", "status": "True", "reason": "A", "message": "", "observedGeneration": 2, "lastTransitionTime": HOUR_BEFORE}]
    assert conditions.set(conds, "Ready", True, reason="A") is True
    assert "observedGeneration" not in conds[0]
    assert conditions.set(conds, "Ready", True, reason="A", observed_generation=0) is False
    assert "observedGeneration" not in conds[0]


def test_unknown_fields_and_other_entries_are_kept():
    conds = [{"type": "Ready", "status": "False", "reason": "A", "message": "", "lastTransitionTime": HOUR_BEFORE, "severity": "Info"}]
    conditions.set(conds, "Ready", True, reason="B", last_transition_time=HOUR_AFTER)
    assert conds[0]["severity"] == "Info"


def test_bools_are_the_api_strings():
    conds: list[dict] = []
    conditions.set(conds, "A", True, reason="R")
    conditions.set(conds, "B", False, reason="R")
    assert [c["status"] for c in conds] == ["True", "False"]


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"status": "true"}, "status 'true' is not one of True, False, Unknown"),
        ({"status": None}, "status None"),
        ({"reason": ""}, "reason '' is not valid"),
        ({"reason": "not ready"}, "reason 'not ready' is not valid"),
        ({"reason": "1st"}, "reason '1st'"),
        ({"type": ""}, "type '' is not a valid type"),
        ({"type": "has space"}, "type 'has space'"),
        ({"observed_generation": -1}, "observed_generation -1 must be an int >= 0"),
        ({"observed_generation": "3"}, "observed_generation '3'"),
        ({"message": "x" * 32769}, "message must be a string of at most 32768"),
        ({"last_transition_time": "yesterday"}, "'yesterday' is not an RFC 3339 time"),
        ({"last_transition_time": datetime.datetime(2026, 1, 1)}, "has no time zone"),
    ],
)
def test_what_the_apiserver_would_refuse_is_refused_here_in_one_line(kwargs, words):
    args = {"type": "Ready", "status": "True", "reason": "Available", **kwargs}
    conds: list[dict] = []
    with pytest.raises(ValueError) as info:
        conditions.set(conds, args.pop("type"), args.pop("status"), **args)
    assert words in str(info.value)
    assert "\n" not in str(info.value)
    assert conds == []


def test_qualified_types_and_reasons_with_punctuation_are_valid():
    conds: list[dict] = []
    assert conditions.set(conds, "example.com/Synced", "True", reason="Done_1,2:3")
    assert conds[0]["type"] == "example.com/Synced"


def test_set_needs_the_list_itself():
    with pytest.raises(TypeError, match=r"not None; pass the status \(obj.status, or status.setdefault\('conditions', \[\]\) for a dict\)"):
        conditions.set(None, "Ready", True, reason="Available")  # type: ignore[arg-type]


def test_the_list_from_setdefault_is_changed_in_place():
    status: dict = {}
    conditions.set(status.setdefault("conditions", []), "Ready", True, reason="Available")
    assert conditions.is_true(status["conditions"], "Ready")


# -- RemoveStatusCondition ------------------------------------------------------------------


def test_remove_present():
    conds = [{"type": "first"}, {"type": "second"}, {"type": "third"}]
    assert conditions.remove(conds, "second") is True
    assert conds == [{"type": "first"}, {"type": "third"}]


def test_remove_not_present():
    conds = [{"type": "first"}, {"type": "second"}, {"type": "third"}]
    assert conditions.remove(conds, "fourth") is False
    assert conds == [{"type": "first"}, {"type": "second"}, {"type": "third"}]


def test_remove_from_empty():
    conds: list[dict] = []
    assert conditions.remove(conds, "Foo") is False
    assert conds == []


def test_remove_keeps_the_same_list_object():
    conds = [{"type": "a"}, {"type": "b"}]
    status = {"conditions": conds}
    conditions.remove(status["conditions"], "a")
    assert status["conditions"] is conds and conds == [{"type": "b"}]


# -- FindStatusCondition --------------------------------------------------------------------


def test_get_not_present():
    assert conditions.get([{"type": "first"}], "second") is None


def test_get_present_returns_the_entry_itself():
    conds = [{"type": "first"}, {"type": "second"}]
    found = conditions.get(conds, "second")
    assert found == {"type": "second"}
    assert found is conds[1]


def test_reads_accept_a_missing_list():
    assert conditions.get(None, "Ready") is None
    assert conditions.is_true(None, "Ready") is False
    assert conditions.is_false(None, "Ready") is False


# -- IsStatusConditionPresentAndEqual / True / False ----------------------------------------


@pytest.mark.parametrize(
    "present, asked, expected",
    [
        ("Unknown", "True", False),  # doesnt-match-true
        ("True", "True", True),  # does-match-true
        ("False", "False", True),  # does-match-false
        ("True", True, True),
        ("False", "Unknown", False),
    ],
)
def test_is_status(present, asked, expected):
    assert conditions.is_status([{"type": "first", "status": present}], "first", asked) is expected


def test_is_true_and_is_false():
    conds = [{"type": "Ready", "status": "True"}, {"type": "Degraded", "status": "False"}, {"type": "Odd", "status": "Unknown"}]
    assert conditions.is_true(conds, "Ready") and not conditions.is_false(conds, "Ready")
    assert conditions.is_false(conds, "Degraded") and not conditions.is_true(conds, "Degraded")
    assert not conditions.is_true(conds, "Odd") and not conditions.is_false(conds, "Odd")
    assert not conditions.is_true(conds, "Missing")


# -- timestamps -----------------------------------------------------------------------------


def test_timestamp_is_utc_whole_seconds():
    aware = datetime.datetime(2026, 5, 1, 14, 0, 7, 999999, tzinfo=datetime.timezone(datetime.timedelta(hours=2)))
    assert conditions.timestamp(aware) == "2026-05-01T12:00:07Z"
    assert conditions.timestamp("2026-05-01T14:00:07.5+02:00") == "2026-05-01T12:00:07Z"
    assert conditions.timestamp("2026-05-01T12:00:07Z") == "2026-05-01T12:00:07Z"


def test_timestamp_defaults_to_now():
    lower = utc_now_seconds()
    assert lower <= parse(conditions.timestamp()) <= utc_now_seconds()


# -- a typed status (declop.Condition), a status dict -----------------------------------------

from typing import Annotated, Literal  # noqa: E402

from pydantic import BaseModel, Field  # noqa: E402

import declop  # noqa: E402
from declop.typed.model import ListType  # noqa: E402
from declop.testing.fakes.apiserver import _json_patch  # noqa: E402
from declop.typed.status import status_ops  # noqa: E402


def stored_after(status, read):
    """The status the apiserver stores after the typed write of ``status`` over ``read``."""
    doc = {"status": read} if read is not None else {}
    return _json_patch(doc, status_ops(status, read)).get("status")


class TypedStatus(BaseModel):
    observedGeneration: int | None = None
    conditions: Annotated[list[declop.Condition], ListType("map", keys=("type",))] = Field(default_factory=list)


class OwnCondition(BaseModel):
    """A project's own condition class (what operators wrote before declop.Condition)."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    observedGeneration: int | None = None
    lastTransitionTime: datetime.datetime


class OwnStatus(BaseModel):
    conditions: list[OwnCondition] | None = None


def test_set_on_a_typed_status_assigns_the_list_back_as_set():
    """A fresh status (its conditions a default never set) gets the list assigned, so a typed
    patch_status sends it — the first Ready condition is never dropped."""
    status = TypedStatus()
    assert conditions.set(status, "Ready", True, reason="Available", message="3/3", observed_generation=2,
                          last_transition_time=HOUR_BEFORE) is True
    assert "conditions" in status.model_fields_set
    (ready,) = status.conditions
    assert isinstance(ready, declop.Condition)
    assert (ready.type, ready.status, ready.reason, ready.message, ready.observedGeneration) == ("Ready", "True", "Available", "3/3", 2)
    assert ready.lastTransitionTime == parse(HOUR_BEFORE)
    assert stored_after(status, None) == {"conditions": [
        {"type": "Ready", "status": "True", "observedGeneration": 2, "lastTransitionTime": HOUR_BEFORE,
         "reason": "Available", "message": "3/3"}]}


def test_an_unchanged_typed_status_is_left_alone_and_the_time_is_kept():
    stored = {"conditions": [{"type": "Ready", "status": "True", "reason": "Available", "message": "ok",
                              "observedGeneration": 4, "lastTransitionTime": HOUR_BEFORE}]}
    status = TypedStatus.model_validate(stored)
    before = status.conditions
    assert conditions.set(status, "Ready", True, reason="Available", message="ok", observed_generation=4) is False
    assert status.conditions is before
    assert conditions.set(status, "Ready", True, reason="Available", message="changed", observed_generation=4) is True
    assert status.conditions[0].lastTransitionTime == parse(HOUR_BEFORE)  # status unchanged: time kept
    assert stored_after(status, stored) == {"conditions": [{**stored["conditions"][0], "message": "changed"}]}


def test_a_status_change_moves_the_time_on_a_typed_status():
    status = TypedStatus.model_validate({"conditions": [
        {"type": "Ready", "status": "False", "reason": "Progressing", "message": "", "lastTransitionTime": HOUR_BEFORE},
        {"type": "Degraded", "status": "False", "reason": "Fine", "message": "", "lastTransitionTime": HOUR_BEFORE}]})
    assert conditions.set(status, "Ready", "True", reason="Available", last_transition_time=HOUR_AFTER)
    assert [c.type for c in status.conditions] == ["Ready", "Degraded"]
    assert status.conditions[0].lastTransitionTime == parse(HOUR_AFTER)
    assert status.conditions[1].lastTransitionTime == parse(HOUR_BEFORE)


def test_the_readers_and_remove_take_a_typed_status():
    status = TypedStatus()
    assert conditions.get(status, "Ready") is None and not conditions.is_true(status, "Ready")
    conditions.set(status, "Ready", True, reason="Available")
    conditions.set(status, "Degraded", False, reason="Fine")
    assert conditions.get(status, "Ready") is status.conditions[0]
    assert conditions.is_true(status, "Ready") and conditions.is_false(status, "Degraded")
    assert conditions.is_status(status, "Degraded", False)
    assert conditions.remove(status, "Missing") is False
    assert conditions.remove(status, "Ready") is True
    assert [c.type for c in status.conditions] == ["Degraded"]
    assert all(isinstance(c, declop.Condition) for c in status.conditions)


def test_a_projects_own_condition_class_and_an_optional_list_are_kept():
    status = OwnStatus()
    conditions.set(status, "Ready", True, reason="Available")
    assert isinstance(status.conditions[0], OwnCondition)
    assert status.model_dump(mode="json", exclude_unset=True)["conditions"][0]["reason"] == "Available"


def test_a_list_of_condition_models_is_changed_in_place():
    status = TypedStatus()
    conditions.set(status, "Ready", False, reason="Progressing")
    entries = status.conditions
    assert conditions.set(entries, "Ready", True, reason="Available") is True
    assert status.conditions is entries and isinstance(entries[0], declop.Condition) and entries[0].status == "True"


def test_a_status_dict_gets_its_list():
    status: dict = {}
    assert conditions.set(status, "Ready", True, reason="Available", last_transition_time=HOUR_BEFORE)
    assert status == {"conditions": [{"type": "Ready", "status": "True", "reason": "Available", "message": "",
                                      "lastTransitionTime": HOUR_BEFORE}]}
    assert conditions.is_true(status, "Ready") and conditions.get(status, "Ready") is status["conditions"][0]
    assert conditions.remove(status, "Ready") and status == {"conditions": []}


def test_a_model_without_conditions_is_one_clear_line():
    class Bare(BaseModel):
        ready: bool = False

    with pytest.raises(TypeError, match=r"^Bare has no conditions field; pass the status model that has one"):
        conditions.set(Bare(), "Ready", True, reason="Available")


def test_what_the_apiserver_refuses_leaves_a_typed_status_alone():
    status = TypedStatus()
    with pytest.raises(ValueError, match="reason '' is not valid"):
        conditions.set(status, "Ready", True, reason="")
    assert status.conditions == [] and "conditions" not in status.model_fields_set
