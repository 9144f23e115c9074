"""The machine's limit, for ``bench/bench_chord.py``: the broker and the backend without Celery.

- ``kombu``: 2 messages per document (a chain's head and its parse), of the size a Celery
  member's message measured, published persistent (as Celery publishes) by the submitter to a
  classic durable queue ``<namespace>.raw.tasks`` and consumed by a separate process (this
  module's ``main``: the "worker") with prefetch ``PREFETCH``, one ack per message. It counts
  each sequence number once and exits when every one came, printing what it saw as JSON.
- ``redis``: the result backend's round trips per document, one at a time from one client, as
  Celery 5.7's Redis backend makes them for a chain of two tasks whose second is a chord member
  (``celery.backends.base.BaseKeyValueStoreBackend._store_result``: a GET of the stored state
  before each write; ``celery.backends.redis.RedisBackend._set``: SETEX and PUBLISH in one
  pipeline; ``RedisBackend.on_chord_part_return``: one EVALSHA of a script that appends the
  result and counts the members). The script here does RPUSH, EXPIRE and LLEN: Celery's does
  more bookkeeping inside Redis, but the same one round trip. 5 round trips per document.

Keys and the queue are under the namespace (``<namespace>:raw:``, ``<namespace>.raw.tasks``);
the caller deletes them.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from typing import Any, cast

import redis
from kombu import Connection, Exchange, Queue

from lab.settings import NAMESPACE, backend_url, broker_url

QUEUE_NAME = f"{NAMESPACE}.raw.tasks"
KEY_PREFIX = f"{NAMESPACE}:raw:"
PREFETCH = 8  # Celery's: worker_prefetch_multiplier 4 x 2 processes
CONSUME_TIMEOUT = 600.0
ROUND_TRIPS_PER_DOC = 5


def raw_queue(quorum: bool = False) -> Queue:
    """Classic by default (Celery's default queue); ``quorum``: a quorum queue, as fm7's (FM-3 on)."""
    arguments = {"x-queue-type": "quorum"} if quorum else None
    return Queue(QUEUE_NAME, Exchange(QUEUE_NAME, type="direct"), routing_key=QUEUE_NAME, durable=True,
                 queue_arguments=arguments)


def payload(seq: int, size: int) -> str:
    """A JSON message body of about ``size`` bytes carrying its sequence number."""
    head = json.dumps({"seq": seq, "pad": ""})
    return json.dumps({"seq": seq, "pad": "x" * max(0, size - len(head))})


def publish(count: int, size: int, quorum: bool = False) -> None:
    """``count`` persistent messages of about ``size`` bytes, one publish each."""
    with Connection(broker_url()) as conn:
        producer = conn.Producer(serializer="json")
        queue = raw_queue(quorum)
        for seq in range(count):
            producer.publish(payload(seq, size), exchange=queue.exchange, routing_key=QUEUE_NAME, declare=[queue],
                             delivery_mode=2, content_type="application/json", content_encoding="utf-8",
                             serializer=None)


def declare(quorum: bool = False) -> None:
    with Connection(broker_url()) as conn:
        raw_queue(quorum).bind(conn.default_channel).declare()


def delete() -> None:
    with Connection(broker_url()) as conn:
        channel = cast(Any, conn.default_channel)
        channel.queue_delete(queue=QUEUE_NAME)
        channel.exchange_delete(exchange=QUEUE_NAME)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def consume(count: int, quorum: bool = False, prefetch: int = PREFETCH, timeout: float = CONSUME_TIMEOUT) -> dict[str, float]:
    """Take ``count`` messages off the queue, acking each; what was seen (each sequence number once?)."""
    seen: set[int] = set()
    duplicates = 0

    def on_message(body: object, message: Any) -> None:
        nonlocal duplicates
        data = cast(dict[str, Any], body if isinstance(body, dict) else json.loads(cast(str | bytes, body)))  # kombu decodes JSON
        seq = int(data["seq"])
        duplicates += seq in seen
        seen.add(seq)
        message.ack()

    deadline = time.monotonic() + timeout
    cpu = _cpu_seconds()
    with Connection(broker_url()) as conn:
        with conn.Consumer(raw_queue(quorum), callbacks=[on_message], accept=["json", "text/plain"], prefetch_count=prefetch):
            while len(seen) < count and time.monotonic() < deadline:
                try:
                    conn.drain_events(timeout=1)
                except TimeoutError:
                    continue
    return {"consumed": len(seen), "duplicates": duplicates, "expected": count, "cpu_seconds": round(_cpu_seconds() - cpu, 3)}


def redis_round_trips(doc_count: int) -> int:
    """The backend's per-document round trips for ``doc_count`` documents; how many were made."""
    r = cast(Any, redis.Redis).from_url(backend_url())
    script = r.register_script("redis.call('RPUSH', KEYS[1], ARGV[1]); redis.call('EXPIRE', KEYS[1], 3600);"
                               " return redis.call('LLEN', KEYS[1])")
    join = f"{KEY_PREFIX}group.j"
    trips = 0
    for i in range(doc_count):
        for task in ("fetch", "parse"):
            key = f"{KEY_PREFIX}task-meta-{i}-{task}"
            value = json.dumps({"status": "SUCCESS", "result": {"doc": f"doc{i}", "words": 4}, "task_id": f"{i}-{task}"})
            r.get(key)
            pipe = r.pipeline()
            pipe.setex(key, 3600, value)
            pipe.publish(key, value)
            pipe.execute()
            trips += 2
        script(keys=[join], args=[f"{i}"])
        trips += 1
    return trips


def main() -> int:
    p = argparse.ArgumentParser(description="consume COUNT raw messages (bench/bench_chord.py's raw kombu row)")
    p.add_argument("count", type=int)
    p.add_argument("--quorum", action="store_true", help="the queue is a quorum queue (fm7's)")
    p.add_argument("--prefetch", type=int, default=PREFETCH)
    args = p.parse_args()
    print(json.dumps(consume(args.count, args.quorum, args.prefetch)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
