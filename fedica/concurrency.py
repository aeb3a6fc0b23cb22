"""Sites answered on several threads of one process: the map that runs them, and the contexts they share.

The in-memory driver (:class:`fedica.protocol.driver.InMemoryFederation`) and the in-process
Grid answer a request's sites one after another unless the task is declared safe to answer
concurrently (:class:`fedica.protocol.tasks.ClientTasks`'s ``concurrent``), and then on
``n_jobs`` threads. A site's ICA spends its time in numpy's ufuncs and BLAS, which release the
GIL, so threads use the cores without copying any site's data to another process; every site
computes exactly what it computes alone (each with its own random stream, one BLAS thread), and
the replies keep the sites' order, so a result does not depend on ``n_jobs``.

Two of a site's settings are process-wide: the BLAS thread count and the warning filters. A
context entered and left by each thread on its own would restore them under another thread's
feet (``warnings.catch_warnings`` is not thread-safe); :class:`SharedContext` enters the setting
once for every thread that holds it and leaves it when the last one leaves.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from joblib import effective_n_jobs
from threadpoolctl import ThreadpoolController

__all__ = ["SharedContext", "one_blas_thread", "thread_map", "thread_count"]

Item = TypeVar("Item")
Result = TypeVar("Result")


class SharedContext(AbstractContextManager):
    """A context several threads may hold at once: ``factory()``'s context, entered by the first and left by the last.

    Parameters
    ----------
    factory : callable
        Makes the context manager to enter (a new one each time no thread holds it).
    """

    def __init__(self, factory: Callable[[], AbstractContextManager]):
        self._factory = factory
        self._lock = threading.Lock()
        self._holders = 0
        self._entered: AbstractContextManager | None = None

    def __enter__(self) -> SharedContext:
        with self._lock:
            if self._holders == 0:
                entered = self._factory()
                entered.__enter__()
                self._entered = entered
            self._holders += 1
        return self

    def __exit__(self, *exc_info: Any) -> None:
        with self._lock:
            self._holders -= 1
            if self._holders == 0:
                entered, self._entered = self._entered, None
                entered.__exit__(None, None, None)


def thread_count(n_jobs: int | None) -> int:
    """The threads ``n_jobs`` asks for, as scikit-learn reads it: None is 1, -1 every core, -2 all but one, ..."""
    return int(effective_n_jobs(n_jobs))


def thread_map(function: Callable[[Item], Result], items: Iterable[Item], n_jobs: int | None) -> list[Result]:
    """``[function(item) for item in items]``, on ``thread_count(n_jobs)`` threads, in ``items``' order.

    An exception of ``function`` is raised here, after every item has been tried (as the loop would
    raise it, but without leaving work running behind).
    """
    items = list(items)
    threads = min(thread_count(n_jobs), len(items))
    if threads <= 1:
        return [function(item) for item in items]
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="fedica-site") as pool:
        futures = [pool.submit(function, item) for item in items]
    return [future.result() for future in futures]


@functools.cache
def _blas_controller() -> ThreadpoolController:
    # Made once: threadpool_limits inspects every loaded shared library at each call (0.04 s in a process that has
    # imported scikit-learn, SciPy and Flower), once per site and request; numpy's and SciPy's BLAS are loaded by the
    # time a site answers.
    return ThreadpoolController()


# Shared by the sites answered on concurrent threads: the limit is process-wide.
_ONE_BLAS_THREAD = SharedContext(lambda: _blas_controller().limit(limits=1, user_api="blas"))


def one_blas_thread() -> SharedContext:
    """A context in which BLAS runs on one thread: a site's small products (an RF-ICA site's ICA and refinement
    averages, a FedGEM site's likelihoods), whose BLAS threads only cost where sites run on every core
    (docs/PERFORMANCE.md). Always the same count, so that a site's numbers do not depend on how it is run."""
    return _ONE_BLAS_THREAD
