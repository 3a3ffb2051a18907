"""RLinf configs: Hydra-composed YAML, validated by pydantic schemas.

Rules:

* A config is a YAML file in a config directory. Its ``defaults:`` list pulls in config
  groups (``runner: base`` reads ``runner/base.yaml``); ``_self_`` marks where the file's
  own keys go (put it last so the file wins over its defaults).
* Command-line overrides follow Hydra: ``runner.max_steps=5`` changes an existing key
  (an unknown key is an error, with the closest existing key suggested), ``+a.b=1`` adds a
  key, ``~a.b`` deletes one, ``runner=other`` picks another group option. ``${a.b}``
  interpolations are resolved before validation.
* The composed dict is validated by a schema: a pydantic model derived from
  :class:`RLinfModel`, so unknown keys are errors. Packages register their top-level schema
  under the ``rlinf.config_schemas`` entry-point group (see :func:`available_schemas`).
* Every failure is a :class:`ConfigError` listing all problems as :class:`ConfigIssue`
  items, each with the dotted key path (``runner.logger.logger_backends[0]``), what is
  allowed and the value given. Problems that are not about a key use the name of what to
  fix instead: ``config_path``, ``config_name``, ``config_file`` or the broken YAML file.

Example::

    cfg = load_config("demo", "examples/quickstart/config", ["runner.max_steps=5"])
    print(dump_config(cfg))
"""

from rlinf.core.config.errors import ConfigError, ConfigIssue
from rlinf.core.config.loader import (
    add_config_arguments,
    available_schemas,
    compose_config,
    config_from_args,
    dump_config,
    load_config,
    load_config_file,
    validate_config,
)
from rlinf.core.config.schema import CoreConfig, LoggerConfig, RLinfModel, RunnerConfig

__all__ = [
    "ConfigError",
    "ConfigIssue",
    "CoreConfig",
    "LoggerConfig",
    "RLinfModel",
    "RunnerConfig",
    "add_config_arguments",
    "available_schemas",
    "compose_config",
    "config_from_args",
    "dump_config",
    "load_config",
    "load_config_file",
    "validate_config",
]
