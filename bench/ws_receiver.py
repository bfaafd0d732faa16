"""WebSocket subscribers for ``bench/throughput.py``, in their own process (so their cost is not
the server's): ``python -m bench.ws_receiver URL N REQUEST_JSON``.

Opens N connections to URL, sends REQUEST_JSON on each (a ``session.subscribe`` request) and
waits for its response; prints ``{"ready": true}`` once all N are subscribed. Then each counts
``message.delta`` frames (a substring test: the receiver does as little as it can) until the
``turn.ended`` frame. A connection cut off for lagging (``subscription.lagged``) does what a
client should: it subscribes again with ``since_seq`` and the session replays what it missed
from its history; when the history no longer reaches back (the answer says ``gap``), the deltas
in between are lost and the count shows it. Last, one JSON line: the span from the first delta
seen on any connection to the last delta on every connection (this process's own clock), the
deltas each connection received, how often they were cut off, how many replays had a gap, and
this process's CPU time.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from typing import Any

import trio
from trio_websocket import open_websocket_url


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def subscriber(
    url: str,
    request: str,
    ready: trio.MemorySendChannel[None],
    results: list[dict[str, Any]],
    firsts: list[float],
) -> None:
    async with open_websocket_url(url, max_message_size=64 * 1024 * 1024) as ws:
        await ws.send_message(request)
        while '"id"' not in (await ws.get_message()):
            pass
        await ready.send(None)
        count = lagged = gaps = 0
        first = last = 0.0
        while True:
            frame = await ws.get_message()
            if '"message.delta"' in frame:
                last = time.perf_counter()
                if count == 0:
                    first = last
                    firsts.append(first)
                count += 1
            elif '"turn.ended"' in frame:
                break
            elif '"subscription.lagged"' in frame:
                # Cut off for falling behind: catch up as a client should, from history.
                lagged += 1
                again = json.loads(request)
                again["id"] = f"again{lagged}"
                again["payload"]["since_seq"] = json.loads(frame)["data"]["last_seq"]
                await ws.send_message(json.dumps(again))
            elif '"gap":true' in frame:
                gaps += 1  # the history no longer reached back: deltas were lost
        results.append(
            {"count": count, "first": first, "last": last, "lagged": lagged, "gaps": gaps}
        )


async def main(url: str, n: int, request: str) -> None:
    results: list[dict[str, Any]] = []
    firsts: list[float] = []
    ready_send, ready_receive = trio.open_memory_channel[None](n)
    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(subscriber, url, request, ready_send, results, firsts)
        for _ in range(n):
            await ready_receive.receive()
        print(json.dumps({"ready": True}), flush=True)
        cpu_before = cpu_seconds()
    cpu = cpu_seconds() - cpu_before
    start = min(firsts) if firsts else 0.0
    end = max(r["last"] for r in results)
    print(
        json.dumps(
            {
                "span_s": end - start,
                "counts": [r["count"] for r in results],
                "lagged": sum(r["lagged"] for r in results),
                "gaps": sum(r["gaps"] for r in results),
                "cpu_s": cpu,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    trio.run(main, sys.argv[1], int(sys.argv[2]), sys.argv[3])
