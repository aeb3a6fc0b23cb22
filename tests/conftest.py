def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "deployment: starts real flower-superlink and flower-supernode processes on loopback (about two minutes); "
        "deselect with -m 'not deployment'",
    )
