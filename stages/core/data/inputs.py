"""Reading user-supplied input files and locations so that a bad one is one line naming it.

* :func:`read_utf8`: a text file's contents; a byte that is not UTF-8 is reported with the file,
  line and byte offset (Python's own ``UnicodeDecodeError`` names no file).
* :func:`loader_reason`: the first sentence of a model loader's (often many-line) error.
* :func:`hub_dataset_id`: decide whether a ``--data-dir`` value that is no local path is a
  Hugging Face dataset id, with one quick hub lookup instead of the dataset loader's retries.
"""
from __future__ import annotations

import os
from pathlib import Path

_OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def read_utf8(path: Path | str, error: type[Exception] = ValueError) -> str:
    """The text of ``path`` decoded as UTF-8.

    Raises:
        error: (default ``ValueError``) the file cannot be read, or holds a byte that is not
            UTF-8; the message names the file, line and byte offset.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise error(f"{path}: cannot read ({err.strerror or err})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise error(f"{path}: line {line}: byte 0x{data[err.start]:02x} at offset {err.start} is not "
                    "UTF-8 text (save the file as UTF-8)") from None


def loader_reason(err: BaseException, width: int = 160) -> str:
    """What failed, from a Hugging Face loader's error: its first sentence on one line, at most
    ``width`` characters (the loaders add paragraphs of advice about network and cache)."""
    reason = " ".join(str(err).split()) or type(err).__name__
    reason = reason.split(". ")[0].rstrip(".")
    return reason if len(reason) <= width else reason[:width - 3] + "..."


def hub_dataset_id(value: str, flag: str = "--data-dir", error: type[Exception] = ValueError) -> str:
    """``value`` (no local path) as a Hugging Face dataset id, after one quick hub lookup.

    A relative path such as ``no_such/dir`` looks like an ``owner/name`` id; handing it to the
    dataset loader costs many seconds of network retries before a vague error. Here the hub is
    asked once (5 s timeout, no retries). In offline mode (``HF_HUB_OFFLINE`` /
    ``HF_DATASETS_OFFLINE``) no lookup is made and the loader's local cache decides.

    Raises:
        error: ``value`` is not ``owner/name``, the hub has no such dataset, or the hub cannot
            be reached; the message says that no local folder of that name exists either.
    """
    where = f"{flag} {value}: no such file or folder (relative to {Path.cwd()})"
    if not _looks_like_id(value):
        raise error(where)
    if any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on") for v in _OFFLINE_VARS):
        return value
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().dataset_info(value, timeout=5)
    except GatedRepoError:
        return value  # exists; the loader says what access it needs
    except RepositoryNotFoundError:
        raise error(f"{where}, and no Hugging Face dataset of that name") from None
    except Exception as err:  # noqa: BLE001 - network failures come in many types (httpx, OSError)
        if not _is_network_error(err):
            return value  # gated/private or a hub hiccup: let the dataset loader report it
        raise error(f"{where}; the Hugging Face hub is unreachable, so it is not a dataset id either "
                    "(set HF_DATASETS_OFFLINE=1 to use a cached copy)") from None
    return value


def _looks_like_id(value: str) -> bool:
    parts = value.split("/")
    return (len(parts) == 2 and all(parts) and not value.startswith((".", "~"))
            and all(c.isalnum() or c in "._-" for c in value.replace("/", "")))


def _is_network_error(err: BaseException) -> bool:
    names = {cls.__name__ for cls in type(err).__mro__}
    return bool(names & {"ConnectError", "ConnectTimeout", "TimeoutException", "NetworkError",
                         "TransportError", "ConnectionError", "OfflineModeIsEnabled"})


def read_config_file(path: str | Path) -> dict:
    """A stage's settings file: TOML (``.toml``) or YAML/JSON (``.yaml``, ``.yml``, ``.json``).

    Returns the mapping of option names (the config fields, e.g. ``max_new_tokens``) to values.

    Raises:
        ValueError: unknown extension, unreadable or unparsable file, or a top level that is no
            mapping (one line naming the file).
    """
    import tomllib

    import yaml

    path = Path(path)
    if path.suffix not in (".toml", ".yaml", ".yml", ".json"):
        raise ValueError(f"{path}: unknown config format {path.suffix!r} (use .toml, .yaml or .json)")
    text = read_utf8(path)
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as err:
        raise ValueError(f"{path}: not valid {path.suffix[1:]}: {str(err).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level must be a mapping of option names to values")
    return data
