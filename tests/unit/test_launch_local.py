"""The local launcher's torchrun port: a user's MASTER_PORT, else one that is free, so two runs side by side on one
node (one GPU each) do not meet at the rendezvous (the fixed 29511 failed with EADDRINUSE on the GPU machine)."""

from __future__ import annotations

import socket

from vlmtrain.launch.local import master_port


def test_a_set_master_port_is_kept() -> None:
    assert master_port({"MASTER_PORT": "29123"}) == "29123"


def test_a_second_run_gets_another_free_port_while_the_first_holds_its_own() -> None:
    first = int(master_port({}))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("", first))
        held.listen()  # the first run's rendezvous store
        second = int(master_port({}))
        assert second != first
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as store:
            store.bind(("", second))  # the second run's store can listen there
