import pytest


@pytest.fixture
def sending():
    """A client-task transform that sends, under ``key`` of ``task``'s reply, the value chosen for each site named.

    ``sending(task, key, {partition_id: value})``: what a hostile or a broken client would send in place of its own.
    """
    def transform_for(task, key, values_by_site):
        def transform(task_name, site, arrays, values, reply):
            if task_name == task and site.partition_id in values_by_site:
                return reply[0], {**reply[1], key: values_by_site[site.partition_id]}
            return reply
        return transform
    return transform_for


@pytest.fixture
def federation_of():
    """``federation_of(server, sites, n_components, transform=None)``: the sites' arrays as an in-memory federation
    answering ``server``'s requests through the library's client tasks (with ``transform`` appended to their chain)."""
    from fedica.data.common import ClientData
    from fedica.protocol import ArraySite, InMemoryFederation
    from fedica.tasks import CLIENT_TASKS

    def build(server, sites, n_components, transform=None):
        tasks = CLIENT_TASKS if transform is None else CLIENT_TASKS.with_transforms(transform)
        array_sites = {g: ArraySite(ClientData(X, None, X[:0], None, n_components), g, None) for g, X in enumerate(sites)}
        return InMemoryFederation(array_sites, tasks, server.rejected)
    return build
