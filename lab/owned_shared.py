"""One owned RabbitMQ node for the runs of this process that need the same one at the same time.

A node's start costs some 5 s of CPU on two cores (its first boot; a restart 4 s), and a lesson's fixed, broken
and before-its-hard-fix runs, which the runner makes at once, each wanted a node of their own: the
connection-loss lesson's ``--prove`` booted three. They may share one: each run's program has queue and
exchange names of its own (``rcl.<short>.*``; the runner never makes two runs of the same program at once),
each run reaches the node through a link of its own (``lab.link.BrokerLink``), which is what a run cuts, and
nothing a run does is node-wide (its consumer timeout closes the one channel it meets). The first caller of
``share_rabbit`` starts it; the others wait for that start and get its error if it failed; the last ``unshare``
removes it."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from lab.owned import OwnedRabbit


@dataclass
class _Share:
    node: OwnedRabbit
    users: int
    started: threading.Event
    failed: BaseException | None = None


_shares: dict[tuple[int | None, int | None], _Share] = {}
_shares_lock = threading.Lock()


def share_rabbit(name: str, consumer_timeout: int | None = None,
                 channel_tick_interval: int | None = None) -> OwnedRabbit:
    """A started ``OwnedRabbit`` with this configuration (``name`` names the folder of one this call starts);
    each call is matched by one ``unshare(node)``."""
    key = (consumer_timeout, channel_tick_interval)
    with _shares_lock:
        share = _shares.get(key)
        first = share is None
        if share is None:
            share = _Share(OwnedRabbit(name, consumer_timeout, channel_tick_interval), 0, threading.Event())
            _shares[key] = share
        share.users += 1
    if first:
        try:
            share.node.start()
        except BaseException as exc:
            share.failed = exc
        finally:
            share.started.set()
    else:
        share.started.wait()
    if share.failed is not None:
        unshare(share.node)
        raise share.failed
    return share.node


def unshare(node: OwnedRabbit) -> None:
    """One use of a node ``share_rabbit`` gave ended: the last removes it. A node it did not give is removed."""
    with _shares_lock:
        for key, share in _shares.items():
            if share.node is node:
                share.users -= 1
                if share.users > 0:
                    return
                del _shares[key]
                break
    node.remove()
