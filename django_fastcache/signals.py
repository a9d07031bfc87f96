"""Django signals about memcached nodes.

The disk tier's, host-wide: ``node_out`` is sent by the process that marks the node out
(from the request that found it failing, or from its background thread when a replay must
take the node out again); ``node_back`` by the process whose background probe replayed the
node's journal and brought it back, and by no other. Both pass ``node`` (the node id, e.g.
``"10.0.0.5:11211"``) and ``directory`` (the disk tier's directory). Other processes on the
host follow the shared node state without being told.

The clients', per process, with or without the disk tier: ``node_unhealthy`` is sent when
a request of this process finds a node failing (refused or dropped connections, no answer
in time), ``node_healthy`` when a request to it gets a reply again. Both pass ``node`` and
``event`` (a :class:`~django_fastcache.client.events.NodeEvent`; ``event.error`` says why a
node turned unhealthy). They are sent once per change, from the thread whose request saw
it; a receiver's exception is logged, never raised into that request.

The sender of every signal is the ``FastCache`` backend class.
"""

from __future__ import annotations

from django.dispatch import Signal

node_out = Signal()
node_back = Signal()
node_unhealthy = Signal()
node_healthy = Signal()
