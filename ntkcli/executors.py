"""Who measures a sweep's points: this process (serial), worker processes on this machine (local), or Ray tasks on a
local Ray instance or a cluster (ray). An experiment hands `Executor.map` a pure function of (shared inputs, point)
and its points; only the driver writes the run folder, in whatever order the points finish (results.csv is kept in
key order, so the CSVs do not depend on who ran the points).

Each worker runs its points with `threads` intra-op threads (the machine's cores divided among the workers, so that
they are not oversubscribed); an exception in a point comes back as `Failed`, and so does a worker that dies (killed,
out of memory): the points that shared its pool then run again one per fresh worker, so that only the point that
kills its worker is recorded as failed.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import socket
import threading
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import torch

from .errors import UserError, first_line

Point = Any
PointFn = Callable[[Any, Point, Callable[[float], None]], Any]  # fn(shared, point, advance) → the point's result


@dataclass
class Failed:
    """A point that raised (its exception, when it could travel back) or whose worker died."""

    reason: str
    error: BaseException | None = None


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _call(fn: PointFn, shared, point, advance) -> Any:
    """fn's result, or Failed with the reason; a UserError (bad input, not a point's failure) still stops the run."""
    try:
        return fn(shared, point, advance)
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001 — a point's failure is recorded, whatever raised it
        return Failed(f"{type(err).__name__}: {first_line(err)}", err)


def _noop(_: float = 1) -> None:
    return None


class Serial:
    """Every point in this process, in order, with the live progress bar, at `threads` intra-op threads."""

    def __init__(self, threads: int | None = None):
        self.threads = threads

    def map(self, fn: PointFn, points: Iterable[Point], shared, advance, cost) -> Iterator[tuple[Point, Any]]:
        before = torch.get_num_threads()
        torch.set_num_threads(self.threads or before)
        try:
            for point in points:
                yield point, _call(fn, shared, point, advance)
        finally:
            torch.set_num_threads(before)

    def close(self) -> None:
        return None


_WORKER: dict = {}  # a local worker's function and shared inputs, set once when it starts


def _start_worker(fn: PointFn, shared, threads: int) -> None:
    torch.set_num_threads(threads)
    _WORKER.update(fn=fn, shared=shared)
    threading.Thread(target=_exit_with_parent, daemon=True).start()


def _exit_with_parent() -> None:
    """End this worker when the driver dies (kill -9 included): its pool's queues never tell it so."""
    multiprocessing.connection.wait([multiprocessing.parent_process().sentinel])
    os._exit(1)


def _in_worker(point):
    return _call(_WORKER["fn"], _WORKER["shared"], point, _noop)


class Local:
    """`workers` processes on this machine (spawned: no state shared with the driver), each given the shared inputs
    once, at most `workers` points in flight."""

    def __init__(self, workers: int, threads: int):
        self.workers, self.threads = workers, threads

    def _pool(self, fn, shared, size: int) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(size, mp_context=multiprocessing.get_context("spawn"), initializer=_start_worker,
                                   initargs=(fn, shared, self.threads))

    def map(self, fn: PointFn, points: Iterable[Point], shared, advance, cost) -> Iterator[tuple[Point, Any]]:
        todo = list(points)
        while todo:
            pool, running = self._pool(fn, shared, self.workers), {}
            try:
                while todo or running:
                    while todo and len(running) < self.workers:
                        point = todo.pop(0)
                        running[pool.submit(_in_worker, point)] = point
                    finished, _ = wait(running, return_when=FIRST_COMPLETED)
                    for future in finished:
                        result = future.result()  # a dead worker raises BrokenProcessPool here
                        point = running.pop(future)
                        advance(cost(point))
                        yield point, result
            except BrokenProcessPool:
                _stop(pool)
                for point in running.values():  # one at a time, so that the point that kills its worker is known
                    result = self._alone(fn, shared, point)
                    advance(cost(point))
                    yield point, result
                continue
            except BaseException:
                _stop(pool)
                raise
            pool.shutdown()

    def _alone(self, fn, shared, point):
        pool = self._pool(fn, shared, 1)
        try:
            return pool.submit(_in_worker, point).result()
        except BrokenProcessPool:
            return Failed("its worker process died (killed, or out of memory)")
        finally:
            _stop(pool)

    def close(self) -> None:
        return None


def _stop(pool: ProcessPoolExecutor) -> None:
    """Stop a pool now: cancel what waits, end the workers (Python 3.11's executor has no public way to end a
    running task)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=10)


def _ray_point(fn: PointFn, shared, point, threads: int):
    torch.set_num_threads(threads)
    return _call(fn, shared, point, _noop)


def _reachable(address: str) -> bool:
    """Whether host:port answers a TCP connection within 5 s ("auto" and ray:// addresses are left to Ray)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if address == "auto" or not port.isdigit():
        return True
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
        return True
    except OSError:
        return False


class Ray:
    """Each point a Ray task asking for `threads` CPUs (and `gpus` GPUs); the shared inputs put in the object store
    once. A local Ray instance with this machine's cores, or the cluster at `address`."""

    def __init__(self, workers: int, threads: int, address: str | None, gpus: float):
        try:
            import ray
        except ImportError:
            raise UserError("the ray executor needs Ray: pip install 'ntkcli[ray]'") from None
        if address and not _reachable(address):
            raise UserError(f"cannot reach the Ray cluster at {address} (is `ray start --head` running there?)")
        self.ray, self.workers, self.threads, self.gpus = ray, workers, threads, gpus
        self.started = not ray.is_initialized()
        if self.started:
            try:
                ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                         configure_logging=False, **({} if address else {"num_cpus": workers * threads}))
            except (ConnectionError, RuntimeError, ValueError) as err:
                raise UserError(f"cannot start Ray{f' at {address}' if address else ''}: {first_line(err)}") from None

    def map(self, fn: PointFn, points: Iterable[Point], shared, advance, cost) -> Iterator[tuple[Point, Any]]:
        ray = self.ray
        task = ray.remote(_ray_point).options(num_cpus=self.threads, num_gpus=self.gpus, max_retries=0)
        ref, running = ray.put(shared), {}
        todo = list(points)
        try:
            while todo or running:
                while todo and len(running) < self.workers:
                    point = todo.pop(0)
                    running[task.remote(fn, ref, point, self.threads)] = point
                (done,), _ = ray.wait(list(running), num_returns=1)
                point = running.pop(done)
                try:
                    result = ray.get(done)
                except ray.exceptions.RayError as err:  # the worker died, or the task could not run
                    result = Failed(f"its Ray task failed: {first_line(err)}")
                advance(cost(point))
                yield point, result
        except BaseException:
            for waiting in running:
                ray.cancel(waiting, force=True)
            raise

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()


def executor(kind: str, workers: int, address: str | None, device: torch.device, threads: int | None = None):
    """The executor a recipe asks for: `kind` auto is serial for one worker, local for more; the threads of each
    point are `threads`, or the cores divided among the workers; on a GPU each Ray task asks for one GPU."""
    kind = ("serial" if workers == 1 else "local") if kind == "auto" else kind
    if address and kind != "ray":
        raise UserError(f"--address is a Ray cluster's address; it needs --executor ray (the executor is {kind})")
    if kind == "serial":
        if workers > 1:
            raise UserError(f"the serial executor runs one point at a time; --workers {workers} needs --executor "
                            "local or ray")
        return Serial(threads)
    threads = threads or max(1, cores() // workers)
    if kind == "local":
        return Local(workers, threads)
    return Ray(workers, threads, address, gpus=1.0 if device.type == "cuda" else 0.0)
