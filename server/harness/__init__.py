"""fedica's experiment harness on the Flower side: what ``fedica-run`` runs, records and writes.

The reusable Flower side (the strategies, the Grid transport :mod:`fedica.server.federation`, the
records codec :mod:`fedica.server.records` and the in-process Grid :mod:`fedica.server.inprocess`)
knows nothing of experiments; this package drives it for fedica's own runs:

- :mod:`~fedica.server.harness.runner`: :func:`~fedica.server.harness.runner.run_federation`, the
  one function every engine drives, and the warnings it counts;
- :mod:`~fedica.server.harness.books`: what a run records that the server never uses (who was hostile,
  FedGEM's rounds so far);
- :mod:`~fedica.server.harness.fedgem_run`, :mod:`~fedica.server.harness.rfica_run`: each algorithm's
  run and its sections of ``result.json``;
- :mod:`~fedica.server.harness.comparators`: the federated comparators' protocols over the run's Grid;
- :mod:`~fedica.server.harness.outputs`: the files a run writes (``result.json``, the sites' labels
  and sources).
"""
