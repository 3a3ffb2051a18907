"""Communication between workers: point-to-point, broadcast and cross-node channels."""

from rlinf.sched.comm.directory import SchedulerResolver, get_directory, install_resolver
from rlinf.sched.comm.errors import CommError, CommTimeoutError, PeerDiedError
from rlinf.sched.comm.p2p import COMM_TIMEOUT_ENV, P2PEndpoint, inbox_name
from rlinf.sched.comm.work import CommWork

__all__ = [
    "COMM_TIMEOUT_ENV",
    "CommError",
    "CommTimeoutError",
    "CommWork",
    "P2PEndpoint",
    "PeerDiedError",
    "SchedulerResolver",
    "get_directory",
    "inbox_name",
    "install_resolver",
]
