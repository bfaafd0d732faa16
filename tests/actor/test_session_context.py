"""An agent that cannot resume its session after a kill gets the conversation so far with the
next prompt, once, bounded (the newest kept), and the turn's ``turn.started`` says so; an agent
that resumes gets nothing more than the prompt. Virtual time, in-memory agents."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from protocols import events as ev
from supervisor.runtime.context import DROPPED, Said, context_text, newest, said_in
from supervisor.testing import FakeAgent, open_test_supervisor, record
from supervisor.testing._fake import PROTOCOLS
from supervisor.wire.codec import event_json

LONG = "word " * 2000  # 20 s at 0.01 s a word: it runs past the grace
ANSWERS = {
    "remember the number 42": "I will remember 42.",
    "tell a long story": LONG,
}


def answer(prompt: str) -> str:
    """The fake's answer: by the prompt the user typed (the end of what the agent got)."""
    for asked, said in ANSWERS.items():
        if prompt.endswith(asked):
            return said
    return "It was 42."


async def kill_then_ask(fake: FakeAgent, *more: str) -> list[ev.TurnStarted]:
    """A turn answered, a turn killed past its grace, then ``what was the number?`` and
    ``more``, each answered: every ``turn.started``."""
    async with open_test_supervisor(agents={"fake": fake}) as sup:
        session = await sup.start_session("fake")
        async with record(session) as events:
            await session.prompt("remember the number 42")
            await events.wait_kind("turn.ended", turn_id="t1")
            await session.prompt("tell a long story")
            await events.wait_kind("message.delta", turn_id="t2")
            receipt = await session.cancel()
            assert receipt.outcome == "killed"
            for number, text in enumerate(("what was the number?", *more), start=3):
                await session.prompt(text)
                await events.wait_kind("turn.ended", turn_id=f"t{number}")
            await events.catch_up()
            events.check_invariants()
            started = [e for e in events.of_kind("turn.started") if isinstance(e, ev.TurnStarted)]
    assert fake.violations == []
    return started


@pytest.mark.parametrize("protocol", [p for p in PROTOCOLS if p != "amp"])
async def test_an_agent_that_cannot_resume_gets_the_conversation_with_the_next_prompt(
    autojump_clock: trio.testing.MockClock, protocol: str
) -> None:
    fake = FakeAgent(
        protocol, reply=answer, on_cancel="ignore", grace_s=3, resumes=False, word_delay=0.01
    )
    started = await kill_then_ask(fake, "and now?")
    given, after = fake.processes[-1].prompts
    assert given.startswith("The conversation so far, for context")
    assert given.endswith("\n\nwhat was the number?")
    for said in (
        "User: remember the number 42",
        "Assistant: I will remember 42.",
        "User: tell a long story",
        "Assistant: word word",  # what it said of the killed turn's answer before the kill
    ):
        assert said in given
    assert after == "and now?"  # once: the turns after it are the fresh session's own
    t1, t2, t3, t4 = started
    assert [t.context for t in started] == [None, None, "injected", None]
    assert t3.text == "what was the number?"  # what clients show: the user's prompt
    assert t3.context_bytes == len(given.encode()) - len(b"what was the number?")
    assert t4.context_bytes is None


async def test_amp_whose_thread_is_lost_gets_the_conversation_in_its_fresh_process(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Amp cannot refuse a resume: its resumed process dies before it says anything, taking
    the prompt it was given with it (that turn fails); the fresh process after it gets the
    conversation, that prompt included, with the next one."""
    fake = FakeAgent("amp", reply=answer, on_cancel="ignore", grace_s=3, resumes=False)
    started = await kill_then_ask(fake, "and now?")
    assert fake.starts == 3
    given = fake.processes[2].prompts[0]
    assert "User: remember the number 42\n\nAssistant: I will remember 42." in given
    assert [t.context for t in started].count("injected") == 1


@pytest.mark.parametrize("protocol", [p for p in PROTOCOLS if p != "amp"])
async def test_an_agent_that_resumes_gets_the_prompt_alone(
    autojump_clock: trio.testing.MockClock, protocol: str
) -> None:
    fake = FakeAgent(protocol, reply=answer, on_cancel="ignore", grace_s=3, word_delay=0.01)
    started = await kill_then_ask(fake)
    assert fake.processes[-1].prompts == ["what was the number?"]
    assert [t.context for t in started] == [None, None, None]


async def test_the_conversation_given_is_bounded_the_newest_kept(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fake = FakeAgent(
        "acp",
        reply=lambda prompt: (
            LONG if "runs long" in prompt else f"answer to {prompt.split()[-1]} " + "x" * 300
        ),
        word_delay=1.0,  # the killed turn says three words in its grace
        on_cancel="ignore",
        grace_s=3,
        resumes=False,
        context_bytes=1024,
    )
    async with open_test_supervisor(agents={"fake": fake}) as sup:
        session = await sup.start_session("fake")
        async with record(session) as events:
            for number in range(1, 6):
                await session.prompt(f"prompt {number}")
                await events.wait_kind("turn.ended", turn_id=f"t{number}")
            await session.prompt("prompt 6 runs long")
            await events.wait_kind("message.delta", turn_id="t6")
            assert (await session.cancel()).outcome == "killed"
            await session.prompt("prompt 7")
            started = await events.wait_kind("turn.started", turn_id="t7")
    assert isinstance(started, ev.TurnStarted)
    given = fake.processes[-1].prompts[0]
    context = given.removesuffix("prompt 7")
    assert len(context.encode()) <= 1024 == 1024
    assert started.context == "injected" and started.context_bytes == len(context.encode())
    assert DROPPED in context  # the preamble says the oldest part is left out
    assert "User: prompt 6 runs long\n\nAssistant: word word word" in context
    assert "User: prompt 5" in context and "Assistant: answer to 5 xxx" in context
    assert "User: prompt 1" not in context


async def test_no_context_when_it_is_turned_off(autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeAgent(
        "acp", reply=answer, on_cancel="ignore", grace_s=3, resumes=False, context_bytes=0
    )
    started = await kill_then_ask(fake)
    assert fake.processes[-1].prompts == ["what was the number?"]
    assert started[-1].context is None


def test_the_text_keeps_the_newest_and_cuts_the_one_that_crosses_the_bound() -> None:
    said = [
        Said("user", "ancient " * 50),
        Said("assistant", "a" * 150 + "the end"),
        Said("user", "q"),
    ]
    text = context_text(said, 330)
    assert len(text.encode()) <= 330
    assert "ancient" not in text and DROPPED in text
    assert "Assistant: …" in text and "the end\n\nUser: q\n\n" in text
    assert "Assistant" not in context_text(said, 250)  # a piece too small to say anything
    assert context_text(said, 100) == ""  # nothing fits beside the preamble
    assert context_text([], 10_000) == ""
    assert newest(said, 10) == said[1:]  # what may still be given, in part, and after


def test_the_history_says_prompts_injected_steers_and_answers_in_order() -> None:
    events: list[ev.Event] = [
        ev.TurnStarted(turn_id="t1", text="first"),
        ev.MessageDelta(turn_id="t1", text="echo", role="user"),
        ev.MessageDelta(turn_id="t1", text="one "),
        ev.ThoughtDelta(turn_id="t1", text="hmm"),
        ev.MessageDelta(turn_id="t1", text="two"),
        ev.TurnSteered(turn_id="t1", mode="injected", text="also this"),
        ev.MessageDelta(turn_id="t1", text="three"),
        ev.TurnEnded(turn_id="t1", outcome="completed"),
        ev.TurnSteered(turn_id="t2", mode="started", text="next"),
        ev.TurnStarted(turn_id="t2", text="next"),
        ev.TurnStarted(turn_id="t3", text="x" * 10, text_bytes=20_000),
    ]
    assert said_in(map(event_json, events)) == [
        Said("user", "first"),
        Said("assistant", "one two"),
        Said("user", "also this"),
        Said("assistant", "three"),
        Said("user", "next"),
        Said("user", "x" * 10 + " […]"),
    ]
