"""Calibrations: vlmtrain's own estimates and metrics checked against what GPU runs measured."""
