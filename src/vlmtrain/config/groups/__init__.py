"""One module per config group: its schema, the Bridge fields it OWNS, and `apply()` that writes them.

Each `conf/<group>/*.yaml` option is data for the schema in `config/groups/<group>.py`; nothing else writes the
fields listed in that module's OWNS (tests/config/test_groups.py checks it), so apply order never matters.
"""

from types import ModuleType

from vlmtrain.config.groups import (
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


def group_name(group: ModuleType) -> str:
    """`vlmtrain.config.groups.cuda_graph` -> `cuda_graph`: the group's key in the run config and on the CLI."""
    return group.__name__.rsplit(".", 1)[1]


GROUPS = (model, data, parallelism, hardware, dispatcher, recompute, cuda_graph, kernels, vision, precision, train)
"""Every group, in the order the plan, the run's choices and the sweep report list them."""
CHOSEN = tuple(group_name(g) for g in GROUPS if g is not train)
"""The groups a run picks an option of (`group=option`, conf/<group>/); train's fields are set one by one."""
