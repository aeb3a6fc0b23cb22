"""Sites answered on several threads (fedica.concurrency): the shared contexts, the map, and results equal for every n_jobs."""

import contextlib
import threading
import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from fedica import RFICA
from fedica.concurrency import SharedContext, thread_count, thread_map
from fedica.data.common import ClientData
from fedica.protocol import ArraySite, ClientTasks, InMemoryFederation, Request
from fedica.rfica.local import local_ica


def test_a_shared_context_is_entered_by_the_first_holder_and_left_by_the_last():
    events = []

    @contextlib.contextmanager
    def setting():
        events.append("enter")
        yield
        events.append("exit")

    shared = SharedContext(setting)
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()

    def first():
        with shared:
            first_in.set()
            second_in.wait(5)
        first_out.set()

    def second():
        first_in.wait(5)
        with shared:
            second_in.set()
            first_out.wait(5)
            events.append("second still inside")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert events == ["enter", "second still inside", "exit"]
    with shared:  # entered anew once every holder has left
        pass
    assert events[-2:] == ["enter", "exit"]


def test_thread_map_keeps_the_order_and_raises_a_failure_after_every_item_ran():
    assert thread_map(lambda x: x * x, range(7), 2) == [0, 1, 4, 9, 16, 25, 36]
    ran = []

    def fail_on_three(x):
        ran.append(x)
        if x == 3:
            raise ValueError("three")
        return x

    with pytest.raises(ValueError, match="three"):
        thread_map(fail_on_three, range(6), 2)
    assert sorted(ran) == list(range(6))
    assert thread_count(None) == 1 and thread_count(3) == 3 and thread_count(-1) >= 1


def test_the_in_memory_driver_runs_only_the_tasks_declared_concurrent_on_threads():
    threads = {}

    def handler(site, arrays, values):
        threads.setdefault(values["task"], set()).add(threading.current_thread().name)
        return {}, {"n-points": site.partition_id}

    data = ClientData(np.zeros((3, 2)), None, np.zeros((0, 2)), None, 1)
    sites = {g: ArraySite(data, g) for g in range(8)}
    tasks = ClientTasks({"heavy": handler, "light": handler}, concurrent=frozenset({"heavy"}))
    federation = InMemoryFederation(sites, tasks, [], n_jobs=2)
    for task in ("heavy", "light"):
        replies = federation.answer(Request(task, 1, None, {"task": task}))
        assert [r.values["n-points"] for r in replies] == list(range(8))  # in partition order
    assert all(name.startswith("fedica-site") for name in threads["heavy"])
    assert threads["light"] == {threading.current_thread().name}


def _laplace_sites(n_sites=6, n=2000, p=6, r=4, seed=0):
    rng = np.random.default_rng(seed)
    mixing = rng.standard_normal((p, r))
    return [rng.laplace(size=(n, r)) @ mixing.T + 0.01 * rng.standard_normal((n, p)) for _ in range(n_sites)]


@pytest.mark.parametrize("n_jobs", [2, -1])
def test_rfica_gives_the_same_bits_on_threads(n_jobs):
    sites = _laplace_sites()
    alone = RFICA(n_components=4, random_state=3).fit(sites)
    threaded = RFICA(n_components=4, random_state=3, n_jobs=n_jobs).fit(sites)
    np.testing.assert_array_equal(threaded.mixing_, alone.mixing_)
    np.testing.assert_array_equal(threaded.site_iterations_, alone.site_iterations_)
    assert threaded.refinement_ == alone.refinement_


def test_fedgem_gives_the_same_bits_with_its_concurrent_stages_on_threads(monkeypatch):
    from functools import partial

    import fedica.fedgem.client as fedgem_client
    import fedica.fedgem.estimator as fedgem_estimator
    from fedica import FedGEM
    from fedica.fedgem.client import CONCURRENT_TASKS
    from fedica.protocol.messages import GEM_CLUSTER_MOMENTS, GEM_EVALUATE, GEM_FAMILY_EM, GEM_LIKELIHOOD

    rng = np.random.default_rng(0)
    centres = rng.normal(scale=8.0, size=(4, 3))
    sites = [np.vstack([rng.normal(centres[k], 1.0, size=(60, 3)) for k in rng.choice(4, 3, replace=False)])
             for _ in range(6)]
    alone = FedGEM(random_state=1).fit(sites)
    assert {GEM_LIKELIHOOD, GEM_FAMILY_EM, GEM_CLUSTER_MOMENTS, GEM_EVALUATE} <= CONCURRENT_TASKS
    monkeypatch.setattr(fedgem_estimator, "InMemoryFederation", partial(InMemoryFederation, n_jobs=2))
    threads = {"likelihoods": set(), "family_em_reply": set(), "cluster_moments_reply": set()}

    def recorded(name):
        original = getattr(fedgem_client, name)

        def on_a_thread(*args):
            threads[name].add(threading.current_thread().name)
            return original(*args)
        return on_a_thread

    for name in threads:
        monkeypatch.setattr(fedgem_client, name, recorded(name))
    threaded = FedGEM(random_state=1).fit(sites)
    assert alone.covariances_ is not None  # the covariance family's stage ran
    for name, names in threads.items():
        assert names and all(thread.startswith("fedica-site") for thread in names), name
    np.testing.assert_array_equal(threaded.means_, alone.means_)
    np.testing.assert_array_equal(threaded.covariances_, alone.covariances_)
    assert [list(labels) for labels in threaded.labels_] == [list(labels) for labels in alone.labels_]
    assert threaded.n_clusters_ == alone.n_clusters_


@pytest.mark.parametrize("n_jobs", [0, 1.5, "2"])
def test_a_bad_n_jobs_is_one_line_naming_it(n_jobs):
    with pytest.raises((TypeError, ValueError), match=r"^n_jobs="):
        RFICA(n_jobs=n_jobs).fit(_laplace_sites(n_sites=2))


@pytest.mark.parametrize("solver", ["fastica", "picard"])
def test_an_unconverged_site_is_reported_without_the_solver_s_warning(solver):
    # Convergence is read from the iteration count (recording warnings is not thread-safe); the solver's own
    # warning is silenced, since the server names such sites in one line.
    site = _laplace_sites(n_sites=1, p=4)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        warnings.filterwarnings("error", message="Picard did not converge")
        result = local_ica(site.T, solver=solver, max_iter=2, random_state=0)
    assert not result.converged and result.n_iter == 2
    converged = local_ica(site.T, solver=solver, random_state=0)
    assert converged.converged and converged.n_iter < 1000


def test_a_fedgem_site_computes_its_likelihoods_and_family_em_steps_on_one_blas_thread(monkeypatch):
    # Two fits sharing the cores, each with BLAS's spinning threads, took 5x as long (digits under `auto`: 65 s
    # against 14 s): a site's small products run on one thread wherever it runs.
    from threadpoolctl import threadpool_info

    import fedica.fedgem.client as fedgem_client
    import fedica.fedgem.families as families
    from fedica import FedGEM

    seen = []

    def counting(original):
        def wrapped(*args, **kwargs):
            seen.append({pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"})
            return original(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(fedgem_client, "mixture_moments", counting(families.mixture_moments))
    monkeypatch.setattr(fedgem_client, "model_geometry", counting(fedgem_client.model_geometry))
    rng = np.random.default_rng(0)
    sites = [np.vstack([rng.normal(c, 1.0, size=(60, 2)) for c in ((0, 0), (8, 0))]) for _ in range(4)]
    FedGEM(covariance_type="full", random_state=0).fit(sites)
    assert seen and all(counts == {1} for counts in seen)
