"""A point function with planted failures, in a module of its own so that a spawned worker imports only this."""

import os
import signal

import torch


def planted(shared: int, point: int, advance) -> int:
    """Point 3 raises, point 5 kills its own worker; any other point gives point² + the worker's threads."""
    if point == 3:
        raise ValueError("planted failure")
    if point == 5:
        os.kill(os.getpid(), signal.SIGKILL)
    return point * point + torch.get_num_threads()
