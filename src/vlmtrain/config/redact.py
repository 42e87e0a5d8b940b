"""Secrets never leave the process in what vlmtrain saves or logs (run_config.yaml, bridge_config.yaml, W&B).

A value is secret when its config key names one and it is a non-empty string (a key names a secret when it ends
in the word `token` or `key` - `hf_token`, `comet_api_key`, not `moe_token_dispatcher_type` or `key_head_dim` - or
has the word `secret`, `password`, `passwd`, `apikey` or `credential(s)` anywhere), or when it contains the value
of a secret environment variable: one whose name contains TOKEN, SECRET, PASSWORD, PASSWD, KEY or CREDENTIAL
(WANDB_API_KEY, HF_TOKEN, ...) and whose value has at least 8 characters. So a secret passed in as
`${oc.env:HF_TOKEN}` or pasted into a URL is caught by value.

Command-line overrides are masked the same way (`+bridge.logger.comet_api_key=<redacted>`): Hydra's files, the
sweep's preflight.json and table; and directory names are built from the overrides without the secret ones
(`override_dirname`), since a credential is no part of a run's identity.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

REDACTED = "<redacted>"
SECRET_LAST_WORDS = frozenset({"token", "key"})
SECRET_WORDS = frozenset({"secret", "password", "passwd", "apikey", "credential", "credentials"})
SECRET_ENV_PARTS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL")
MIN_ENV_SECRET_LEN = 8
"""Shorter env values (`1`, `true`) are too common to hunt for inside other strings."""


def words(name: str) -> list[str]:
    """`WANDB_API_KEY` -> [wandb, api, key]; `hfToken` -> [hf, token]."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [w.lower() for w in re.split(r"[^A-Za-z0-9]+", spaced) if w]


def is_secret_name(name: str) -> bool:
    parts = words(name)
    return bool(parts) and (parts[-1] in SECRET_LAST_WORDS or any(w in SECRET_WORDS for w in parts))


def is_secret_env_name(name: str) -> bool:
    return any(part in name.upper() for part in SECRET_ENV_PARTS)


def secret_env(environ: Mapping[str, str]) -> dict[str, str]:
    """Secret environment variables whose values are long enough to search for, longest value first."""
    found = {k: v.strip() for k, v in environ.items()
             if is_secret_env_name(k) and len(v.strip()) >= MIN_ENV_SECRET_LEN}
    return dict(sorted(found.items(), key=lambda kv: -len(kv[1])))


@dataclass(frozen=True)
class Masking:
    """What a secret becomes: `env(name)` replaces an env var's value inside a string, `literal(path, value)`
    replaces the whole value of a secret-named key."""

    env: Callable[[str], str] = lambda name: REDACTED
    literal: Callable[[str, str], str] = lambda path, value: REDACTED


def env_reference(name: str) -> str:
    """`${oc.env:NAME,'<redacted>'}`: the value where NAME is set (the ranks), `<redacted>` elsewhere (a later
    reader of the file)."""
    return "${oc.env:" + name + ",'" + REDACTED + "'}"


def stash_in_env(path: str, value: str) -> str:
    """Hand a literal secret to child processes through the environment; the file keeps only a reference."""
    name = "VLMTRAIN_SECRET_" + re.sub(r"[^A-Za-z0-9]+", "_", path).strip("_").upper()
    os.environ[name] = value
    return env_reference(name)


PLAIN = Masking()
"""For records (W&B config, bridge_config.yaml): every secret becomes `<redacted>`."""
ENV_REFERENCES = Masking(env=env_reference, literal=stash_in_env)
"""For configs that ranks load back (run_config.yaml): secrets become `${oc.env:...}` that OmegaConf resolves in
a process that inherited this one's environment (and to `<redacted>` in any other)."""


def redact(tree: Any, environ: Mapping[str, str] | None = None, masking: Masking = PLAIN) -> Any:
    """A copy of a JSON-like tree (dicts, lists, scalars) with every secret masked."""
    env = secret_env(os.environ if environ is None else environ)
    return _walk(tree, "", env, masking)


def _walk(node: Any, path: str, env: dict[str, str], masking: Masking) -> Any:
    if isinstance(node, Mapping):
        return {k: _item(str(k), v, f"{path}.{k}" if path else str(k), env, masking) for k, v in node.items()}
    if isinstance(node, list | tuple):
        return [_walk(v, f"{path}[{i}]", env, masking) for i, v in enumerate(node)]
    if isinstance(node, str):
        return _mask_env(node, env, masking)
    return node


def _item(key: str, value: Any, path: str, env: dict[str, str], masking: Masking) -> Any:
    if isinstance(value, str) and value and is_secret_name(key):
        masked = _mask_env(value, env, masking)
        return masked if masked != value else masking.literal(path, value)
    return _walk(value, path, env, masking)


def _mask_env(text: str, env: dict[str, str], masking: Masking) -> str:
    for name, value in env.items():
        if value in text:
            text = text.replace(value, masking.env(name))
    return text


def is_secret_override(line: str, environ: Mapping[str, str] | None = None) -> bool:
    """`key=value` whose key names a secret (its last dotted part) or whose value holds a secret env value."""
    key, sep, value = line.partition("=")
    if not sep or not value:
        return False
    env = secret_env(os.environ if environ is None else environ)
    return is_secret_name(key.lstrip("+~").split(".")[-1]) or _mask_env(value, env, PLAIN) != value


def redact_overrides(lines: list[str] | tuple[str, ...], environ: Mapping[str, str] | None = None) -> list[str]:
    """Hydra override lines with every secret value replaced by `<redacted>`."""
    return [line.partition("=")[0] + "=" + REDACTED if is_secret_override(line, environ) else line
            for line in lines]


MAX_DIRNAME = 200  # leaves room for the sweep's `<job>_` prefix under NAME_MAX (255)


def override_dirname(overrides: list[str], exclude_keys: list[str], item_sep: str, kv_sep: str) -> str:
    """Hydra's `hydra.job.override_dirname` (its own function, same settings) over the overrides that carry no
    secret: the name of a checkpoint or sweep-job directory never holds a credential, and rotating a key keeps
    the same directory. One path component: `/` in a value becomes `_` (the job number keeps names unique), and
    a name over MAX_DIRNAME characters keeps its head and a hash of the whole (the filesystem's limit is 255)."""
    from hydra._internal.config_loader_impl import get_overrides_dirname
    from hydra.core.override_parser.overrides_parser import OverridesParser

    kept = [o for o in overrides if not is_secret_override(o)]
    name = get_overrides_dirname(OverridesParser.create().parse_overrides(kept), list(exclude_keys), item_sep, kv_sep)
    name = name.replace("/", "_")  # a path value (train.checkpoint_dir=/a/b) must not nest the job's run dir
    if len(name) <= MAX_DIRNAME:
        return name
    return f"{name[: MAX_DIRNAME - 9]}~{hashlib.sha1(name.encode()).hexdigest()[:8]}"


class LogFilter(logging.Filter):
    """Masks given secret values (and secret env values) in every record of the logger it is on: Hydra's
    launchers log each job's overrides (`#0 : ... +bridge.logger.comet_api_key=...`)."""

    def __init__(self, values: list[str]):
        super().__init__()
        self.values = sorted({v for v in values if v}, key=len, reverse=True)

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        masked = _mask_env(text, secret_env(os.environ), PLAIN)
        for value in self.values:
            masked = masked.replace(value, REDACTED)
        if masked != text:
            record.msg, record.args = masked, None
        return True


def mask_logs(overrides: list[str], logger_names: list[str]) -> None:
    """The named loggers mask the values of the secret overrides from now on. On the logger itself, not its
    handlers: Hydra reconfigures logging (new handlers) around every job, and leaves a logger's filters alone."""
    values = [line.partition("=")[2] for line in overrides if is_secret_override(line)]
    for name in logger_names:
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, LogFilter)]:
            logger.removeFilter(old)
        logger.addFilter(LogFilter(values))


def hydra_files(config: Any) -> dict[str, Any]:
    """What Hydra's run_job writes into `<run dir>/.hydra/` (config.yaml, hydra.yaml, overrides.yaml, unresolved),
    secrets masked: the task config and Hydra's own config with its override lists and override_dirname."""
    from omegaconf import OmegaConf

    tree = OmegaConf.to_container(config, resolve=False)
    hydra = tree.pop("hydra")
    task = list(hydra["overrides"]["task"])
    for kind in ("task", "hydra"):
        hydra["overrides"][kind] = redact_overrides(hydra["overrides"][kind])
    c = hydra["job"]["config"]["override_dirname"]
    hydra["job"]["override_dirname"] = override_dirname(task, c["exclude_keys"], c["item_sep"], c["kv_sep"])
    return {"config.yaml": redact(tree), "hydra.yaml": {"hydra": redact(hydra)},
            "overrides.yaml": hydra["overrides"]["task"]}


def write_bridge_yaml(cfg: ConfigContainer, path: Path) -> None:
    """What `cfg.to_yaml(path)` writes, secrets masked."""
    import yaml
    from megatron.training.config.yaml_utils import safe_yaml_representers

    with safe_yaml_representers(), Path(path).open("w") as f:
        yaml.safe_dump(redact(cfg.to_dict()), f, default_flow_style=False)
