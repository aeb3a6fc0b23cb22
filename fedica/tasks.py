"""fedica's client task registry: every task a fedica client answers, and the chain of reply transforms.

One :class:`~fedica.protocol.tasks.ClientTasks` for every path a client's work takes: fedica's
Flower ClientApp (``fedica.clients.app``) routes every message type to it, and the library's
estimators (:class:`fedica.FedGEM`, :class:`fedica.RFICA`) answer their in-memory requests with
it. The handlers are the algorithms' own (``TASKS`` of :mod:`fedica.rfica.client`,
:mod:`fedica.fedgem.client`, :mod:`fedica.evaluation.ffcm`, :mod:`fedica.evaluation.afcl`); the
chain holds the hostile behaviour of robustness runs (:func:`fedica.attacks.hostile.hostile_reply`), which
changes only the replies of the clients a run's ``attack`` config makes hostile. A new reply
transform (a privacy step, say) is one function appended here, or ``CLIENT_TASKS.with_transforms(step)``
for one run.
"""

from __future__ import annotations

from fedica.evaluation import afcl, ffcm
from fedica.fedgem import client as fedgem_client
from fedica.fedgem.privacy import private_reply
from fedica.attacks.hostile import hostile_reply
from fedica.protocol.tasks import KIT_TASKS, ClientTasks, digest_reply
from fedica.rfica import client as rfica_client
from fedica.rfica.privacy import private_mixing_reply

CLIENT_TASKS = ClientTasks(
    handlers={**KIT_TASKS, **rfica_client.TASKS, **fedgem_client.TASKS, **ffcm.TASKS, **afcl.TASKS},
    # Privacy first: a hostile site replaces whatever it likes of its private reply; the data digest of a journalled
    # run's first reply is the site's own (a hostile site may send any, as any reply).
    transforms=(private_reply, private_mixing_reply, hostile_reply, digest_reply),
    concurrent=rfica_client.CONCURRENT_TASKS | fedgem_client.CONCURRENT_TASKS,
)
