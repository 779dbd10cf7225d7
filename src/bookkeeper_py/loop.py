"""How the long-running processes run their event loop (a bookie, AutoRecovery, a benchmark's
client and its tailing reader): on uvloop where it is installed, else on asyncio's loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Runs ``coroutine`` to its end on a new loop and returns its result."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def call_on(loop: asyncio.AbstractEventLoop, call: Callable[[], T]) -> T:
    """Runs ``call`` on ``loop``'s thread and returns its result, from any thread: at once where
    this is that thread or the loop does not run, else by handing it over and waiting (the loop
    must not be waiting for the caller)."""
    if asyncio._get_running_loop() is loop or not loop.is_running():
        return call()
    result: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run_it() -> None:
        try:
            result.set_result(call())
        except BaseException as error:  # handed to the waiting thread
            result.set_exception(error)

    loop.call_soon_threadsafe(run_it)
    return result.result()
