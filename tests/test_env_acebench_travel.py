"""ACEBench's Travel API (multi-turn tasks 20-29): state machine, bad arguments, scoring in the env."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from stages.envs import make_env
from stages.envs import acebench_multi
from stages.envs.acebench import load_tasks
from stages.envs.acebench_multi import user_prompt
from stages.envs.acebench_score import end_to_end
from stages.envs.acebench_travel import TravelPlatform

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "acebench"
needs_data = pytest.mark.skipif(not (DATA / "data_agent_multi_turn.json").is_file(), reason=f"no ACEBench data at {DATA}")


def _call(name: str, **args) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


class ScriptedUser:
    """Stands in for the simulated user: says its opening line, then "finish conversation"."""

    def __init__(self, model, instruction, involved_classes=(), **settings):
        self.instruction, self.settings = instruction, settings

    def opening(self):
        return "I need help with a flight."

    def reply(self, agent_message):
        return "Thanks. finish conversation"

    finished = staticmethod(acebench_multi.SimulatedUser.finished)


@pytest.fixture
def env(monkeypatch):
    monkeypatch.setattr(acebench_multi, "SimulatedUser", ScriptedUser)
    return make_env("acebench", data_dir=DATA, user_model="scripted", episode_rules="lenient")


def _travel(task_id: str):
    return next(t for t in load_tasks(DATA, "multi_turn") if t.task_id == task_id)


@needs_data
def test_all_thirty_multi_turn_tasks_load():
    tasks = load_tasks(DATA, "multi_turn")
    assert len(tasks) == 30 and len({t.task_id for t in tasks}) == 30
    travel = [t for t in tasks if "Travel" in t.meta["involved_classes"]]
    assert [t.task_id for t in travel] == [f"agent_multi_turn_{i}" for i in range(20, 30)]
    assert all("reserve_flight" in t.tools and t.meta["ground_truth"][0].keys() == {"Travel"} for t in travel)


@needs_data
def test_hand_written_calls_reach_the_possible_answer():
    """Task 25 (Eve moves her Shanghai-Beijing flight to the next evening, economy) and task 26 (Grace
    books Beijing-Shenzhen via Nanjing), with the calls an agent would make, checked step by step."""
    p = TravelPlatform({})
    assert p.call("get_user_details", {"user_id": "user1", "password": "password123"}) == {
        "user_name": "Eve", "cash_balance": 2000.0, "bank_balance": 50000.0, "membership_level": "regular"}
    mine = p.call("get_reservation_details", {"user_id": "user1"})
    assert [r["reservation_id"] for r in mine] == ["res_1", "res_2"] and mine[1]["flight_info"]["flight_no"] == "MU5678"
    back = p.call("get_flight_details", {"origin": "Shanghai", "destination": "Beijing"})
    assert [(f["flight_no"], f["depart_time"]) for f in back] == [
        ("MU5678", "2024-07-16 09:00:00"), ("CZ4321", "2024-07-16 20:00:00"), ("CZ4352", "2024-07-17 20:00:00")]
    said = p.call("modify_flight", {"user_id": "user1", "reservation_id": "res_2", "new_flight_no": "CZ4352",
                                    "new_cabin": "Economy Class"})
    assert said == "Flight number has been changed. Cabin change successful. Price difference refunded: 1100."
    assert end_to_end(p.state(), _travel("agent_multi_turn_25").meta["ground_truth"]) == (True, [])

    p = TravelPlatform({})
    assert p.call("get_flight_details", {"origin": "Beijing", "destination": "Shenzhen"}).startswith("There are no direct")
    legs = p.call("find_transfer_flights", {"origin_city": "Beijing", "transfer_city": "Nanjing",
                                            "destination_city": "Shenzhen"})
    assert [(x["first_leg"]["flight_no"], x["second_leg"]["depart_time"]) for x in legs] == [
        ("MU3561", "2024-07-18 12:30:00")]  # the only leg pair that connects
    for no in ("MU3561", "CZ1765"):
        said = p.call("reserve_flight", {"user_id": "user3", "password": "password789", "flight_no": no,
                                         "cabin": "Economy Class", "payment_method": "bank", "baggage_count": 1})
        assert said.startswith("Booking successful") and "Total cost: 1500 yuan" in said
    ok, _ = end_to_end(p.state(), _travel("agent_multi_turn_26").meta["ground_truth"])
    assert ok
    ok, errors = end_to_end(p.state(), _travel("agent_multi_turn_25").meta["ground_truth"])
    assert not ok and errors == ["Travel.users differs", "Travel.reservations differs"]


def test_balance_bags_and_cancellation_rules():
    p = TravelPlatform({})
    said = p.call("reserve_flight", {"user_id": "user3", "password": "password789", "flight_no": "MU1566",
                                     "cabin": "Business Class", "payment_method": "cash", "baggage_count": 1})
    assert said.startswith("Your cash balance is insufficient") and len(p.reservations) == 4
    said = p.call("reserve_flight", {"user_id": "user2", "password": "password456", "flight_no": "CA1234",
                                     "cabin": "Economy Class", "payment_method": "cash", "baggage_count": 4})
    assert "Total cost: 1300 yuan" in said and p.users["user2"]["cash_balance"] == 6700.0  # silver: 2 free, 2 x 50
    assert p.reservations[-1] == {"reservation_id": "res_5", "user_id": "user2", "flight_no": "CA1234",
                                  "payment_method": "cash", "cabin": "Economy Class", "baggage": 4}
    said = p.call("cancel_reservation", {"user_id": "user1", "reservation_id": "res_1", "reason": "change of plans"})
    assert said.startswith("More than 24 hours before departure") and p.users["user1"]["cash_balance"] == 3200.0
    assert len(p.reservations) == 5  # upstream keeps the cancelled reservation
    assert p.call("cancel_reservation", {"user_id": "user2", "reservation_id": "res_1", "reason": "x"}).startswith(
        "Invalid reservation ID")
    said = p.call("modify_flight", {"user_id": "user3", "reservation_id": "res_1"})
    assert said == "Reservation not found or user ID does not match."
    said = p.call("modify_flight", {"user_id": "user1", "reservation_id": "res_1", "new_flight_no": "MU5678"})
    assert said.startswith("Flight change failed") and p.reservations[0]["flight_no"] == "CA1234"


def test_bad_arguments_give_error_results_and_change_nothing():
    p = TravelPlatform({})
    before = p.state()
    good = {"user_id": "user1", "password": "password123", "flight_no": "CA1234", "cabin": "Economy Class",
            "payment_method": "bank", "baggage_count": 1}
    bad = [("book_hotel", {}), ("reserve_flight", {**good, "payment_methods": "bank"}),
           ("reserve_flight", {k: v for k, v in good.items() if k != "cabin"}),
           ("reserve_flight", {**good, "baggage_count": "1"}), ("reserve_flight", {**good, "baggage_count": True}),
           ("reserve_flight", {**good, "baggage_count": -1}), ("reserve_flight", {**good, "cabin": "economy"}),
           ("reserve_flight", {**good, "payment_method": "card"}), ("reserve_flight", {**good, "flight_no": "ZZ999"}),
           ("reserve_flight", {**good, "password": "wrong"}), ("reserve_flight", {**good, "user_id": ["user1"]}),
           ("reserve_flight", {**good, "cabin": None}),
           ("modify_flight", {"user_id": "user1", "reservation_id": "res_2", "new_cabin": "First Class"}),
           ("modify_flight", {"user_id": "user1", "reservation_id": "res_2", "new_payment_method": "credit",
                              "add_baggage": 2}),
           ("modify_flight", {"user_id": "user1", "reservation_id": "res_2", "add_baggage": 1.5}),
           ("get_reservation_details", {}), ("get_user_details", {"user_id": "user1", "password": 123}),
           ("cancel_reservation", {"user_id": "user9", "reservation_id": "res_1", "reason": "x"})]
    for name, args in bad:
        result = p.call(name, args)
        assert (result.get("status") == "error" if isinstance(result, dict)
                else result.startswith(("Authentication failed", "Invalid"))), (name, args, result)
        assert p.state() == before, (name, args)
    # an optional argument given as null counts as not given
    assert p.call("modify_flight", {"user_id": "user1", "reservation_id": "res_2", "new_cabin": None,
                                    "add_baggage": None}) == "Modification completed with no additional fees."


@needs_data
def test_env_scores_a_travel_task_pass_and_fail(env):
    task = _travel("agent_multi_turn_20")  # Frank books CA1234 economy, bank, 1 bag
    search = _call("get_flight_details", origin="Beijing", destination="Shanghai")
    book = dict(user_id="user2", password="password456", flight_no="CA1234", payment_method="bank", baggage_count=1)

    system, opening = env.reset(task)
    assert system.content.startswith("You are an AI airline agent") and opening.content == "I need help with a flight."
    found = env.step(search)
    assert not found.done and json.loads(found.observation[0].content)[0]["flight_no"] == "CA1234"
    assert not env.step(_call("reserve_flight", cabin="Economy Class", **book)).done
    result = env.step("Booked CA1234 for you. Anything else?")  # no call: the user answers and finishes
    assert result.done and result.reward == 1.0 and result.info["end_to_end"] and result.info["mismatches"] == []

    env.reset(task)
    env.step(search)
    env.step(_call("reserve_flight", cabin="Business Class", **book))  # the wrong cabin
    result = env.step("Booked. Anything else?")
    assert result.done and not result.info["end_to_end"] and result.info["process_accuracy"] == 0.5
    assert result.reward == 0.5 and "Travel.users differs" in result.info["mismatches"]

    env.reset(task)
    garbled = env.step(_call("reserve_flight", baggage_count=[1]))  # malformed arguments: an error result
    assert not garbled.done and "Invalid arguments" in garbled.observation[0].content
    result = env.step("Sorry, I cannot book it.")
    assert result.done and result.reward == 0.0 and not result.info["end_to_end"]


@needs_data
def test_every_travel_milestone_path_reaches_its_end_state(env):
    from tests.test_env_acebench import _action, _path

    for task in load_tasks(DATA, "multi_turn")[20:]:
        env.reset(task)
        for step in _path(task):
            assert not env.step(_action(step)).done
        result = env.step("Done. Anything else?")
        assert result.done and result.info["end_to_end"] and result.reward == 1.0, task.task_id


def test_user_prompt_follows_the_involved_classes():
    travel = user_prompt("You are Frank.", ["Travel"])
    phone = user_prompt("You are Frank.", ["BaseApi", "MessageApi"])
    assert "Your instruction: You are Frank." in travel and "round-trip" in travel and "airline agent" in travel
    assert "Your instruction: You are Frank." in phone and "round-trip" not in phone and "phone" in phone
