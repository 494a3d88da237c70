"""The simulated provider's turns: callers are answered one at a time in the order of their first requests' text,
whatever order they arrive in, and a caller that leaves (its last answer, or refused by the broker) passes its turn.
"""

from __future__ import annotations

import anyio

from swarmyard.broker.chat import ChatRequest, Message, Role, Tool
from swarmyard.broker.providers.protocol import CallState
from swarmyard.broker.providers.simulated import SimulatedProvider
from swarmyard.broker.providers.turns import Turns, stable_text


def test_ids_are_blanked_from_a_callers_key() -> None:
    assert stable_text("post by wrk_01m8thssj32jtp9c67n3a54ezg: hi") == "post by ID: hi"


async def _take_turns(arrivals: list[str], rounds: int) -> list[str]:
    turns = Turns(len(arrivals), stall_s=30)
    order: list[str] = []

    async def caller(name: str, delay: float) -> None:
        await anyio.sleep(delay)
        for _ in range(rounds):
            await turns.wait(name, f"task {name}")
            order.append(name)
            await anyio.sleep(0.001 * (3 - len(name)))  # acting on the answer takes a different time each
        turns.leave(name)

    async with anyio.create_task_group() as group:
        for index, name in enumerate(arrivals):
            group.start_soon(caller, name, 0.002 * index)
    return order


def test_callers_take_turns_in_the_order_of_their_keys_whatever_order_they_arrive_in() -> None:
    first = anyio.run(_take_turns, ["a", "bb", "c"], 3)
    second = anyio.run(_take_turns, ["c", "a", "bb"], 3)
    assert first == second  # the same sequence of turns
    assert len(first) == 9 and first[:3] == first[3:6] == first[6:]  # round after round, each once a round


def test_a_caller_refused_before_its_first_call_frees_its_seat() -> None:
    async def main() -> list[str]:
        turns = Turns(2, stall_s=30)
        turns.leave("refused")  # the broker refused it: no request of it will ever come
        with anyio.fail_after(5):
            await turns.wait("other", "task other")
        return ["answered"]

    assert anyio.run(main) == ["answered"]
    assert not Turns(1).broken


def test_the_simulated_model_answers_the_same_attempts_to_the_same_caller_and_call() -> None:
    def request() -> ChatRequest:
        brief = "Task: hidden code\nFind the hidden 16-digit code of instance 3."
        return ChatRequest("sim", (Message(Role.USER, brief),), (Tool("submit_artifact", "", {"type": "object"}),))

    async def answers(caller: str) -> list[str]:
        provider = SimulatedProvider(simulate="attempts")
        return [(await provider.complete(request(), CallState(caller=caller))).text for _ in range(3)]

    # keyed by the caller's first request and its call count, not by the worker's id
    assert anyio.run(answers, "wrk_a") == anyio.run(answers, "wrk_b")
    assert len(set(anyio.run(answers, "wrk_a"))) == 3  # each call draws afresh

