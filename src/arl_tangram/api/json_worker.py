"""Shell: the JSON worker, a child process that parses large request bodies for the server.

Run as ``python -I -S json_worker.py`` (stdlib only, so it starts in milliseconds and
imports nothing of the server). Why a process: ``json.loads`` of a large body holds the
interpreter lock for the whole parse (a 100 MB body: seconds), and a thread would stall the
server's event loop just the same. The worker parses, checks the nesting depth, and sends
the value back as a program of small steps, each frame a pickle of at most about
``PIECE_BYTES``, which the server (``api.json_body``) applies between its other work.

Wire, both ways frames of a 4-byte big-endian length and a payload. In: the body's chunks,
then an empty frame. Out: frames, each a list of ops, ending with one holding ``("done",)``
or ``("error", rule)``. The ops (``value`` is JSON-small: at most ``PIECE_BYTES``):
``("v", value)`` attach a value; ``("[",)`` / ``("{",)`` open a list / an object;
``('"',)`` open a long string, ``("s", piece)`` add to it; ``("x", items)`` extend the open
list; ``("u", pairs)`` update the open object; ``("k", key)`` the key of the next value
attached to the open object; ``("]",)`` close the innermost open one and attach it. One
body after another, until stdin closes.
"""

from __future__ import annotations

import json
import pickle
import struct
import sys
from collections.abc import Iterator
from typing import Any, BinaryIO

PIECE_BYTES = 128 << 10
MAX_DEPTH = 200  # JSON nesting levels (the same rule as api.json_body's)
MAX_KEY_BYTES = PIECE_BYTES
_LEN = struct.Struct(">I")


class Refused(ValueError):
    """The body breaks a rule; the message is the rule."""


def weigh(value: Any, depth: int, memo: dict[int, int]) -> int:
    """About the bytes of ``value`` as JSON; containers' weights memoised by id; depth checked."""
    if depth > MAX_DEPTH:
        raise Refused(f"must nest at most {MAX_DEPTH} levels")
    if isinstance(value, str):
        return len(value) + 2
    if isinstance(value, list):
        total = 2 + sum(weigh(v, depth + 1, memo) + 1 for v in value)
    elif isinstance(value, dict):
        total = 2
        for k, v in value.items():
            if len(k) > MAX_KEY_BYTES:
                raise Refused(f"object keys must be at most {MAX_KEY_BYTES} characters")
            total += len(k) + 4 + weigh(v, depth + 1, memo)
    else:
        return 8
    memo[id(value)] = total
    return total


def program(value: Any, memo: dict[int, int]) -> Iterator[tuple[tuple[Any, ...], int]]:
    """(op, its weight) that rebuild ``value``; every op's payload is at most a piece."""
    weight = memo.get(id(value), 0) if isinstance(value, list | dict) else len(value) if isinstance(value, str) else 8
    if weight <= PIECE_BYTES:
        yield ("v", value), weight
    elif isinstance(value, str):
        yield ('"',), 1
        for i in range(0, len(value), PIECE_BYTES):
            yield ("s", value[i : i + PIECE_BYTES]), PIECE_BYTES
        yield ("]",), 1
    elif isinstance(value, list):
        yield ("[",), 1
        yield from _batched(((None, v) for v in value), memo, list_items=True)
        yield ("]",), 1
    else:
        yield ("{",), 1
        yield from _batched(iter(value.items()), memo, list_items=False)
        yield ("]",), 1


def _batched(entries: Iterator[tuple[Any, Any]], memo: dict[int, int], list_items: bool) -> Iterator[tuple[tuple[Any, ...], int]]:
    batch: list[Any] = []
    weight = 0

    def flush() -> tuple[Any, ...]:
        op = ("x", list(batch)) if list_items else ("u", dict(batch))
        batch.clear()
        return op

    for key, v in entries:
        w = memo.get(id(v), 0) if isinstance(v, list | dict) else len(v) + 2 if isinstance(v, str) else 8
        if w > PIECE_BYTES:
            if batch:
                yield flush(), weight
                weight = 0
            if not list_items:
                yield ("k", key), len(key)
            yield from program(v, memo)
            continue
        if weight + w > PIECE_BYTES and batch:
            yield flush(), weight
            weight = 0
        batch.append(v if list_items else (key, v))
        weight += w + (0 if list_items else len(key))
    if batch:
        yield flush(), weight


def _frames(ops: Iterator[tuple[tuple[Any, ...], int]]) -> Iterator[list[tuple[Any, ...]]]:
    frame: list[tuple[Any, ...]] = []
    weight = 0
    for op, w in ops:
        if frame and weight + w > PIECE_BYTES:
            yield frame
            frame, weight = [], 0
        frame.append(op)
        weight += w
    yield frame


def _read_body(stdin: BinaryIO) -> bytes | None:
    chunks: list[bytes] = []
    while True:
        head = stdin.read(4)
        if len(head) < 4:
            return None
        (n,) = _LEN.unpack(head)
        if n == 0:
            return b"".join(chunks)
        chunks.append(stdin.read(n))


def _send(stdout: BinaryIO, ops: list[tuple[Any, ...]]) -> None:
    data = pickle.dumps(ops, protocol=pickle.HIGHEST_PROTOCOL)
    stdout.write(_LEN.pack(len(data)) + data)


def serve_one(body: bytes, stdout: BinaryIO) -> None:
    try:
        value = json.loads(body)
        memo: dict[int, int] = {}
        weigh(value, 1, memo)
    except RecursionError:
        _send(stdout, [("error", f"must nest at most {MAX_DEPTH} levels")])
    except Refused as exc:
        _send(stdout, [("error", str(exc))])
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        _send(stdout, [("error", f"must be valid JSON ({exc})"[:300])])
    else:
        for frame in _frames(program(value, memo)):
            _send(stdout, frame)
        _send(stdout, [("done",)])
    stdout.flush()


def main() -> None:
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 4 * MAX_DEPTH + 100))
    while (body := _read_body(sys.stdin.buffer)) is not None:
        serve_one(body, sys.stdout.buffer)


if __name__ == "__main__":
    main()
