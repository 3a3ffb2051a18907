"""The UCX home helper process of one channel-agent connection.

What: ``python -m rlinf.core.ucx_home`` runs ``_native.ucx_home_main``: its own UCX
worker and progress thread, speaking frames with the agent on stdin/stdout, until
stdin ends. The agent (``rlinf.core._native.ChannelAgent``) starts one per UCX
connection with this interpreter, so Python users configure nothing;
``RLINF_UCX_HOME_HELPER`` (a command) overrides it.

Why: UCX aborts the process it runs in when a peer dies mid-transfer over
``UCX_TLS=tcp``; in this helper that ends only the one connection, not the process
that owns the channels (docs/channel.md).

Cost: one extra process per UCX connection on the home node, started on the
connection's hello: opening a UCX connection took 77 ms (median) with this helper,
against 20 ms with the worker in the home process before (an interpreter start).
"""

import os

from rlinf.core import _native

if __name__ == "__main__":
    # os._exit: no interpreter teardown while UCX's progress thread runs.
    os._exit(_native.ucx_home_main())
