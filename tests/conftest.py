def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "deployment: starts real flower-superlink and flower-supernode processes on loopback (about two minutes); "
        "deselect with -m 'not deployment'",
    )
    config.addinivalue_line(
        "markers",
        "ray_cluster: starts a real two-node Ray cluster (two `ray start` processes) on this machine (about a minute); "
        "deselect with -m 'not ray_cluster'",
    )
