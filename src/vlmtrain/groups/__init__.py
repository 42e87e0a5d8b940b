"""One module per config group: its schema, the Bridge fields it OWNS, and `apply()` that writes them.

Each `conf/<group>/*.yaml` option is data for the schema in `groups/<group>.py`; nothing else writes the
fields listed in that module's OWNS (tests/config/test_groups.py checks it), so apply order never matters.
"""

from vlmtrain.groups import (
    cuda_graph,
    data,
    dispatcher,
    hardware,
    kernels,
    model,
    parallelism,
    precision,
    recompute,
    train,
    vision,
)

# The order only fixes how the dry-run plan lists groups; OWNS sets are disjoint.
ALL = (model, parallelism, hardware, dispatcher, recompute, cuda_graph, kernels, vision, precision, data, train)
