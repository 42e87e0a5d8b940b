"""The lab's kit: what every experiment is made of, and all an experiment needs to import from the lab.

- `case`: `Case`, a named `python train.py` run (its command line written once), and `placed_resolved`;
- `baselines`: the model baselines cases are built from, a baseline's length, the real-file datasets cases read;
- `runner`: every process the lab starts (a Case's run, its ranks, cases side by side, any other command);
- `store`: results rows read and written, a name's current row, the machine run rows are grouped by, a case's row;
- `schedule`: the (case, run) pairs a machine run still needs under a budget, and each case's summary row;
- `spec`: conf/tune/*.yaml as cases (sweeps) and search stages (tune);
- `experiments`: the index of every experiment, its one parser, the flags experiments share.

The kit imports no experiment (tests/lab/test_lab_surface.py): an experiment module builds on it, and another
experiment's module is imported only for what that experiment owns (tune's trial runner, the peer ratio).
"""
