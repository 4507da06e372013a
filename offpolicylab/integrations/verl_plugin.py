"""Import hook for verl workers: importing this module registers every offpolicylab objective with verl.

Use ``VERL_USE_EXTERNAL_MODULES=offpolicylab.integrations.verl_plugin`` (verl imports the listed modules in every
process that imports verl, Ray workers included) and set parameters with ``OFFPOLICYLAB_VERL_PARAMS``
(JSON, e.g. ``{"m2po": {"tau": 0.04}}``); see :func:`offpolicylab.integrations.verl.register_with_verl`.
"""

from offpolicylab.integrations.verl import register_with_verl

REGISTERED = register_with_verl()
