"""torchrun for one machine with every listening socket on loopback:
``python -m runtime.launcher [torchrun arguments]``.

torchrun's c10d rendezvous store and the store it shares with its workers are ``TCPStore``
servers, and a ``TCPStore`` server listens on every interface whatever host it is given: a
one-node job would accept connections from the whole network. This wrapper runs torchrun
(``torch.distributed.run``) in this process with ``TCPStore`` servers created on a socket bound
to 127.0.0.1 (``master_listen_fd``), when the host they are given is a loopback name. Use it
with ``--rdzv-endpoint 127.0.0.1:0 --local-addr 127.0.0.1`` (the workers then find the store at
127.0.0.1) and ``GLOO_SOCKET_IFNAME=lo`` for the workers' own gloo sockets; ``planner launch``
does all three for a one-node launch. A non-loopback host (several nodes) is left as torchrun
has it.
"""
from __future__ import annotations

import ipaddress
import socket
import sys

LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _loopback_listener(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    addr = host.strip("[]") if family == socket.AF_INET6 else "127.0.0.1"
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(1024)
    return s


def install() -> None:
    """Replace ``torch.distributed.TCPStore`` (and torchrun's imported copies) with a subclass
    whose servers on a loopback host listen on loopback only."""
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend, static_tcp_rendezvous

    base = dist.TCPStore
    if getattr(base, "_loopback_only", False):
        return

    class LoopbackTCPStore(base):
        _loopback_only = True

        def __init__(self, host_name, port, world_size=None, is_master=False, *args, **kwargs):
            if is_master and kwargs.get("master_listen_fd") is None and is_loopback(str(host_name)):
                listener = _loopback_listener(str(host_name), int(port))
                port = listener.getsockname()[1]
                kwargs["master_listen_fd"] = listener.detach()   # the store owns the socket now
            super().__init__(host_name, port, world_size, is_master, *args, **kwargs)

    dist.TCPStore = LoopbackTCPStore
    c10d_rendezvous_backend.TCPStore = LoopbackTCPStore
    static_tcp_rendezvous.TCPStore = LoopbackTCPStore


REFUSED = 2     # a worker's exit code for input it refused (runtime.worker.run: one line, no traceback)


class _QuietRefusals:
    """Drops torchrun's per-worker "failed (exitcode: 2)" log records: the worker said why in one line."""

    def filter(self, record) -> bool:
        return f"(exitcode: {REFUSED})" not in record.getMessage()


def main(argv: list[str] | None = None) -> None:
    """torchrun, except that a job whose failed workers all refused their input (exit 2, each
    having printed its one-line reason) exits 2 without torchrun's traceback and failure report
    (a crash, or a signal, keeps both: they name the rank that failed)."""
    import logging

    install()
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main
    sys.argv[0] = "torchrun"
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(_QuietRefusals())
    try:
        torchrun_main(argv if argv is not None else sys.argv[1:])
    except ChildFailedError as e:
        codes = {f.exitcode for f in e.failures.values()}
        if codes != {REFUSED}:
            raise
        sys.stderr.write(f"torchrun: {len(e.failures)} worker(s) refused the job (exit {REFUSED}); their "
                         "messages are above\n")
        sys.exit(REFUSED)


if __name__ == "__main__":
    main()
