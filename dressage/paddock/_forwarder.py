"""Loopback-to-Unix-socket forwarder that runs INSIDE a bubblewrap sandbox (stdlib only).

Usage: ``python3 _forwarder.py PORT SOCKET -- CMD [ARGS...]``

The sandbox has its own network namespace with only ``lo``; the host's proxy socket is bind-mounted
at SOCKET. This script listens on ``127.0.0.1:PORT`` *before* starting CMD (so CMD never races the
listener), relays every connection to SOCKET, runs CMD with the inherited stdio, forwards SIGTERM /
SIGINT to it, and exits with CMD's status (``128 + N`` when CMD died of signal N). It must run on
any python3 the sandbox image has, so it uses nothing outside the standard library.
"""

import signal
import socket
import subprocess
import sys
import threading

CONNECT_TIMEOUT_S = 10.0
"""How long a connection waits for the host's socket to accept it (the worker's relay, a local
process that accepts at once unless it hangs); then the agent's connection is closed, not held."""


def _pump(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


def _relay(conn, sock_path):
    try:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        upstream.settimeout(CONNECT_TIMEOUT_S)
        upstream.connect(sock_path)
        upstream.settimeout(None)
    except OSError:  # socket.timeout is an OSError
        conn.close()
        return
    t = threading.Thread(target=_pump, args=(upstream, conn), daemon=True)
    t.start()
    _pump(conn, upstream)
    t.join()
    conn.close()
    upstream.close()


def _serve(listener, sock_path):
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        # Relay small writes at once: with Nagle on, a response's last bytes wait for a delayed ACK.
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_relay, args=(conn, sock_path), daemon=True).start()


def main(argv):
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write("usage: _forwarder.py PORT SOCKET -- CMD...\n")
        return 2
    port, sock_path, cmd = int(argv[0]), argv[1], argv[3:]
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    threading.Thread(target=_serve, args=(listener, sock_path), daemon=True).start()
    try:
        child = subprocess.Popen(cmd)
    except OSError as e:
        sys.stderr.write(f"sandbox: cannot run {cmd[0]!r}: {e}\n")
        return 127
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    code = child.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
