"""Stub of vLLM's network helpers: a free local TCP port."""
import socket


def get_open_port() -> int:
    """A port the OS reports free on 127.0.0.1 (bind to port 0, read the port back)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
