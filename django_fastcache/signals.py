"""Django signals sent when a memcached node goes out and when it comes back.

``node_out`` is sent by the process that first finds the node failing (from the request
that failed); ``node_back`` by the process whose background probe replayed the node's
journal and brought it back. Both pass ``node`` (the node id, e.g. ``"10.0.0.5:11211"``)
and ``directory`` (the disk tier's directory). Signals are per process: other processes on
the host follow the shared node state without being told.
"""

from __future__ import annotations

from django.dispatch import Signal

node_out = Signal()
node_back = Signal()
