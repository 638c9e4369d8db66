"""Training configuration: YAML files plus dotted ``key=value`` overrides, validated against the schema.

Every key is declared once in the schema, `experiments.app.config_schema` (`SCHEMA`: one `Key` per key, its
default, rule, types and a one-line meaning; `DEFAULTS`, `RULES`, `NULLABLE`, `TYPES` and `choices` derived from
it), whose names this module re-exports for its importers. Here: loading (`load_config`, `load_config_sources`: a
shipped config's name or a file, its ``extends`` chain, ``section.key=value`` overrides), validation (`validate`:
every key must exist in `DEFAULTS` -- an unknown key is a `ConfigError` listing the valid keys at that level --,
every value must have the default's type, ``None`` defaults accepting the types in `NULLABLE`, and obey its rule;
then the rules between keys, `CROSS_RULES`), writing (`dump_config`, `dump_config_sources`) and the reference page
``docs/config_reference.md`` (`reference`, ``python -m experiments.app.config --reference``).

Every YAML text the project reads goes through `load_yaml` (re-exported here), the strict safe loader of
`experiments.runfolder.strict_yaml`.
"""
from __future__ import annotations

import copy
import json
import os
import pathlib
import re
from typing import Any, Dict, Iterable, Optional

import yaml

from energies.checks import parse_float
from energies.errors import ConfigError, UnfoldError
from unfold.documents import read_document

from ..runfolder.strict_yaml import MAX_YAML_DEPTH, StrictYAMLError, load_yaml, show
from .config_schema import (CHOICE_KEYS, DEFAULTS, KEYS, NULLABLE, RULES, SCHEMA, TYPES, Checked, Choice, Key,
                            Range, Text, choices, is_graph_file)

__all__ = ["SCHEMA", "KEYS", "Key", "Choice", "Checked", "reference", "DEFAULTS", "RULES", "Range", "Text", "choices",
           "load_config", "apply_overrides", "validate", "dump_config", "ConfigError", "load_yaml",
           "load_config_sources", "dump_config_sources", "config_chain", "EXTENDS", "StrictYAMLError",
           "MAX_YAML_DEPTH"]



def with_defaults(cfg: Dict[str, Any], defaults: Dict[str, Any] = None) -> Dict[str, Any]:
    """A copy of ``cfg`` with every key it lacks taken from ``defaults`` (`DEFAULTS`), section by section: a
    config written before a key existed reads as it ran."""
    defaults = DEFAULTS if defaults is None else defaults
    out = copy.deepcopy(defaults)
    for key, value in cfg.items():
        both = isinstance(defaults.get(key), dict) and isinstance(value, dict)
        out[key] = with_defaults(value, defaults[key]) if both else copy.deepcopy(value)
    return out


def monitor_mode(cfg: Dict[str, Any]) -> str:
    """``train.monitor`` with its default resolved: warn when the training trace is on, off otherwise."""
    tc = cfg["train"]
    return tc["monitor"] or ("warn" if tc["trace"] else "off")


def _valid_keys(defaults: Dict[str, Any]) -> str:
    return ", ".join(sorted(defaults))


def merge_config(base: Dict[str, Any], new: Dict[str, Any], defaults: Dict[str, Any], path: str,
                 sources: Optional[Dict[str, str]] = None, origin: str = "") -> None:
    """Merge the config document ``new`` into ``base`` section by section (a leaf replaces, a section merges),
    refusing a key that ``defaults`` does not hold or a section that is not a mapping (`ConfigError` naming it;
    ``path``: the dotted section ``new`` is, "" for a whole config); where ``sources`` is given, each leaf written
    records ``origin`` under its dotted key. A config file, an override and a bundle's ``config.json`` are read
    through it, over a copy of `DEFAULTS`, then `validate`d."""
    if not isinstance(new, dict):
        raise ConfigError(f"config section {path or '<root>'} must be a mapping, got {type(new).__name__}")
    for key, value in new.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in defaults:
            raise ConfigError(f"unknown config key {show(where)}; valid keys{' in ' + path if path else ''}: "
                              f"{_valid_keys(defaults)}")
        if isinstance(defaults[key], dict):
            merge_config(base[key], value, defaults[key], where, sources, origin)
        else:
            base[key] = value
            if sources is not None:
                sources[where] = origin


def _check_rule(where: tuple, value) -> None:
    name = ".".join(where)
    if where in CHOICE_KEYS and value not in choices(where):
        raise ConfigError(f"config key {name!r} must be one of {list(choices(where))}, got {show(value)}")
    rule = RULES.get(where)
    if isinstance(rule, Range):
        if rule.integer and isinstance(value, float):
            raise ConfigError(f"config key {name!r} must be {rule.describe()}, got {show(value)}")
        if not rule.holds(value):
            raise ConfigError(f"config key {name!r} must be {rule.describe()}, got {show(value)}")
    elif isinstance(rule, Text) and (not value.strip() or (rule.pattern and not re.fullmatch(rule.pattern, value))):
        raise ConfigError(f"config key {name!r} must be {rule.rule}, got {show(value)}")
    if isinstance(rule, (Text, Checked)) and rule.check is not None:
        try:
            rule.check(value)
        except ConfigError:
            raise
        except UnfoldError as exc:
            raise ConfigError(f"config key {name!r}={show(value)}: {exc}") from None


def _takes(mode: str, param: str) -> bool:
    """Whether the encoder registered as ``mode`` takes the constructor argument ``param`` (plug-ins included)."""
    import inspect

    from unfold.encoders import ENCODERS

    return mode in ENCODERS and param in inspect.signature(ENCODERS[mode]).parameters


def _check_cross(cfg: Dict[str, Any]) -> None:
    """Rules between keys: each names both keys and their values."""
    tc = cfg["train"]
    spec = cfg["model"]["graph"]
    if is_graph_file(spec):       # its node ids must fit the longest sequence
        from energies.graphs import graph_from_spec

        try:
            graph_from_spec(spec, cfg["data"]["max_len"])
        except UnfoldError as exc:
            raise ConfigError(f"config key 'model.graph'={spec!r} with data.max_len={cfg['data']['max_len']}: "
                              f"{exc}") from None
    stop_rel, mode = cfg["model"]["stop_rel"], cfg["model"]["mode"]
    if stop_rel not in (None, 0) and not _takes(mode, "stop_rel"):
        raise ConfigError(f"config key 'model.stop_rel'={show(stop_rel)} (the depth chosen by the energy) applies to "
                          f"weight-shared encoders that take it (guaranteed), not to model.mode={mode!r}: set "
                          "model.stop_rel=null")
    _check_listops(cfg["data"])
    _check_subword(cfg["data"])
    if tc["monitor"] not in (None, "off") and not tc["trace"]:
        raise ConfigError(f"config key 'train.monitor'={tc['monitor']!r} watches the training energy trace, which "
                          "train.trace=false turns off: set train.trace=true or train.monitor=off")


def _check_subword(dc: Dict[str, Any]) -> None:
    """A subword tokenizer (``data.tokenizer`` other than words) takes no GloVe word vectors and no
    ``data.max_vocab`` (its size is its own N): both refused naming the two keys, never silently ignored."""
    spec = dc["tokenizer"]
    if spec == "words":
        return
    if dc["glove"] != "none":
        raise ConfigError(f"config key 'data.glove'={show(dc['glove'])} gives GloVe vectors to words, and "
                          f"data.tokenizer={show(spec)} makes subword tokens: set data.glove=none (or "
                          "data.tokenizer=words)")
    if dc["max_vocab"] is not None:
        raise ConfigError(f"config key 'data.max_vocab'={dc['max_vocab']} caps the word vocabulary; "
                          f"data.tokenizer={show(spec)} has its own size: set data.max_vocab=null")


def check_config_files(cfg: Dict[str, Any]) -> None:
    """The files a config names for its data, checked when the config is loaded (`load_config_sources`),
    not when a bundle's config is read (a bundle holds its own tokenizer and needs none of them):
    ``data.texts`` must be a readable text file or folder of ``*.txt`` files, and ``data.tokenizer``, where it
    is a path, a readable ``tokenizer.json`` (a `DataError` naming the file, read as the trainer reads it)."""
    from ..data.core import DataError
    from ..data.stream import check_text_source
    from ..data.subword import SubwordTokenizer, parse_tokenizer_spec

    dc = cfg["data"]
    if dc["texts"] is not None:
        try:
            check_text_source(dc["texts"])
        except UnfoldError as exc:
            raise ConfigError(f"config key 'data.texts'={show(dc['texts'])}: {exc}") from None
    spec = parse_tokenizer_spec(dc["tokenizer"])
    if spec.kind == "file":
        try:
            SubwordTokenizer.load(spec.path)
        except DataError as exc:
            raise DataError(f"config key 'data.tokenizer'={show(spec.path)}: {exc}") from None


def _check_listops(dc: Dict[str, Any]) -> None:
    """``data.listops_*`` apply to ``data.dataset=listops`` only (elsewhere refused, never silently ignored);
    there, ``min_len <= max_len <= data.max_len`` (a longer example would be truncated), null being the
    generator's default (`experiments.data.listops.DEFAULTS`)."""
    from ..data.listops import CONFIG_KEYS, DEFAULTS as LISTOPS

    if dc["dataset"] != "listops":
        for k, key in CONFIG_KEYS.items():
            if dc.get(f"listops_{k}") is not None:
                raise ConfigError(f"config key {key!r}={show(dc[f'listops_{k}'])} applies to data.dataset=listops "
                                  f"only, not to data.dataset={show(dc['dataset'])}; leave it null")
        return
    lo = dc["listops_min_len"] if dc["listops_min_len"] is not None else LISTOPS["min_len"]
    hi = dc["listops_max_len"] if dc["listops_max_len"] is not None else LISTOPS["max_len"]
    if lo > hi:
        raise ConfigError(f"config key 'data.listops_min_len'={lo} exceeds data.listops_max_len={hi}")
    if hi > dc["max_len"]:
        default = " (the default)" if dc["listops_max_len"] is None else ""
        raise ConfigError(f"config key 'data.listops_max_len'={hi}{default} exceeds data.max_len={dc['max_len']}: "
                          "longer examples would be truncated; raise data.max_len or lower data.listops_max_len")


def validate(cfg: Dict[str, Any], defaults: Dict[str, Any] = DEFAULTS, path: tuple = ()) -> Dict[str, Any]:
    """Check every value's type against the defaults and its declared rule (`RULES`, `choices`),
    then (at the top level) the rules between keys; returns ``cfg``, numbers normalised (int -> float keys)."""
    for key, default in defaults.items():
        where = path + (key,)
        value = cfg.get(key, default)
        name = ".".join(where)
        if isinstance(default, dict):
            if not isinstance(value, dict):
                raise ConfigError(f"config section {name!r} must be a mapping, got {type(value).__name__}")
            validate(value, default, where)
            continue
        if value is None:
            if default is not None and where not in NULLABLE:
                raise ConfigError(f"config key {name!r} must not be null")
            continue
        allowed = NULLABLE.get(where) or TYPES.get(where) or (type(default),)
        if float in allowed and isinstance(value, int) and not isinstance(value, bool):
            value = cfg[key] = float(value)
        if float in allowed and isinstance(value, str):      # YAML 1.1 reads 1e-3 (no dot) as a string
            try:                                             # (ASCII digits only: energies.checks.parse_float)
                value = cfg[key] = parse_float(value)
            except ValueError:
                pass
        if isinstance(value, bool) and bool not in allowed:
            raise ConfigError(f"config key {name!r} must be {'/'.join(t.__name__ for t in allowed)}, got bool {value!r}")
        if not isinstance(value, allowed):
            raise ConfigError(f"config key {name!r} must be {'/'.join(t.__name__ for t in allowed)}, "
                              f"got {type(value).__name__} {show(value)}")
        _check_rule(where, value)
    if not path:
        _check_cross(cfg)
    return cfg


def _is_text_key(where: tuple) -> bool:
    node: Any = DEFAULTS
    for k in where:
        if not isinstance(node, dict) or k not in node:
            return False
        node = node[k]
    return isinstance(node, str) or str in NULLABLE.get(where, ())


def _too_deep(value, limit: int = MAX_YAML_DEPTH) -> bool:
    """Whether ``value`` nests lists and dicts more than ``limit`` levels deep (iterative; shared parts once)."""
    stack, seen = [(value, 1)], set()
    while stack:
        v, depth = stack.pop()
        if not isinstance(v, (dict, list)) or id(v) in seen:
            continue
        if depth > limit:
            return True
        seen.add(id(v))
        stack.extend((c, depth + 1) for c in (v.values() if isinstance(v, dict) else v))
    return False


def apply_overrides(cfg: Dict[str, Any], overrides: Iterable[str],
                    sources: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Apply ``section.key=value`` strings (values parsed as YAML by `load_yaml`: 3, 0.5, true, null, text;
    a value that is not YAML is taken as text). A value with a repeated key or nested deeper than
    `MAX_YAML_DEPTH` levels (key path included) is a `ConfigError` naming the override."""
    for item in overrides:
        if not isinstance(item, str) or "=" not in item:
            raise ConfigError(f"override {show(item)} must look like section.key=value")
        dotted, raw = item.split("=", 1)
        keys = dotted.strip().split(".")
        try:
            value = load_yaml(raw)
        except StrictYAMLError as exc:
            if not _is_text_key(tuple(keys)):
                raise ConfigError(f"override {show(item)}: {exc}") from None
            value = raw        # a text key takes the text as typed (below), whatever YAML makes of it
        except (yaml.YAMLError, ValueError):   # ValueError: an integer beyond Python's digit limit
            value = raw
        if _is_text_key(tuple(keys)) and value is not None:
            value = raw        # a text key takes the text as typed (YAML would read "hf:x" as a mapping, "007" as 7)
        nested: Dict[str, Any] = value
        for k in reversed(keys):
            nested = {k: nested}
        if len(keys) > MAX_YAML_DEPTH or _too_deep(nested):
            raise ConfigError(f"override {show(item)}: nested deeper than {MAX_YAML_DEPTH} levels (a config is "
                              "3 levels deep)")
        merge_config(cfg, nested, DEFAULTS, "", sources, "override")
    return cfg


#: the configs shipped with the package (package data), found by name: ``--config default``
CONFIG_DIR = pathlib.Path(__file__).resolve().parent.parent / "configs"


def config_names() -> list:
    """Names of the shipped configs (``experiments/configs/NAME.yaml``), sorted."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


#: the extensions of a config file: a bare name with one of them may name a user's file, one without never does
CONFIG_EXTENSIONS = (".yaml", ".yml")


def _is_path(spec: str) -> bool:
    """Whether a config spec is an explicit path (it holds a path separator: ``./tiny``, ``sub/a.yaml``)."""
    return os.sep in spec or "/" in spec or bool(os.altsep and os.altsep in spec)


def _shipped(spec: str) -> Optional[str]:
    """The shipped config a bare name names (``tiny`` or ``tiny.yaml``), or None. A path never names one."""
    if _is_path(spec):
        return None
    stem = spec[:-len(".yaml")] if spec.endswith(".yaml") else spec
    return str(CONFIG_DIR / f"{stem}.yaml") if stem in config_names() else None


def resolve_config(spec: str) -> str:
    """The file a ``--config`` value names. A shipped config's name without extension (``default``, from
    `CONFIG_DIR`, so that it works outside the repository) is always the shipped config, whatever file of that
    name the current folder holds (write ``./default`` for that file); a path (it holds a separator) or an existing
    file is read as given; else a shipped config's file name (``default.yaml``). A value that is none of these is
    refused listing the shipped names."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"--config must name a config file or a shipped config, got {spec!r}; shipped: "
                          f"{', '.join(config_names())}")
    shipped = _shipped(spec)
    if shipped is not None and not spec.endswith(CONFIG_EXTENSIONS):
        return shipped                  # a built-in name: the built-in config, never a stray file
    if os.path.isfile(spec) or _is_path(spec):
        return spec                     # a file, or a path: read (and its problems reported) as a path
    if shipped is not None:
        return shipped
    raise ConfigError(f"config {spec!r} is neither a file nor a shipped config; shipped: {', '.join(config_names())}")


#: the key of a config file that names the config it builds on (a shipped name or a path relative to the file)
EXTENDS = "extends"

#: longest chain of ``extends`` followed (far beyond any real use; a guard, the circle check comes first)
MAX_EXTENDS = 32


def _parent_file(spec, child: str) -> str:
    """The file ``extends: SPEC`` of ``child`` names, by three rules: a path (``./tiny``, ``sub/base.yaml``, one
    holding a separator) is that file, relative to ``child``'s folder; a bare name with a config extension
    (``base.yaml``, ``base.yml``) is the file of that name beside ``child`` where it exists, else the shipped config
    of that file name; a bare name without one (``tiny``) is a shipped config only (`CONFIG_DIR`), never a file --
    an extension-less file beside ``child`` is named ``./tiny``. Returns the file's path (a user's file as an
    absolute path, so that ``--print-config`` names the file read)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"config file {child!r}: '{EXTENDS}' must name a shipped config ({', '.join(config_names())}) "
                          f"or a file relative to it, got {show(spec)}")
    relative = os.path.abspath(os.path.join(os.path.dirname(child), spec))
    if _is_path(spec):
        if os.path.isfile(relative):
            return relative
        raise ConfigError(f"config file {child!r}: '{EXTENDS}: {spec}' names no file ({relative!r} does not exist)")
    if spec.endswith(CONFIG_EXTENSIONS) and os.path.isfile(relative):
        return relative
    shipped = _shipped(spec)
    if shipped is not None:
        return shipped
    beside = (f" (a file {relative!r} exists, but a name without .yaml/.yml names a shipped config only: write "
              f"'{EXTENDS}: ./{spec}' to build on that file)" if os.path.isfile(relative) else "")
    raise ConfigError(f"config file {child!r}: '{EXTENDS}: {spec}' is neither a file beside it nor a shipped "
                      f"config{beside}; shipped: {', '.join(config_names())}")


def _read_file(path: str) -> Dict[str, Any]:
    loaded = read_document(path, load_yaml, ConfigError, f"config file {path!r}", "YAML",
                           (yaml.YAMLError, ValueError))
    loaded = {} if loaded is None else loaded
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path!r} must hold a mapping of sections (data, model, train), "
                          f"got a YAML {type(loaded).__name__}")
    return loaded


def config_chain(path: str) -> list:
    """``[(file, mapping), ...]`` from the first ancestor to ``path`` itself, following ``extends`` (removed
    from each mapping). A circular chain is a `ConfigError` naming the files in order."""
    chain: list = []
    seen: list = []
    current = path
    while True:
        real = os.path.realpath(current)
        if real in seen:
            loop = [f for f, _ in chain[seen.index(real):]] + [current]
            raise ConfigError(f"circular '{EXTENDS}' chain: {' -> '.join(loop)}")
        if len(seen) >= MAX_EXTENDS:
            raise ConfigError(f"config file {path!r}: '{EXTENDS}' chain longer than {MAX_EXTENDS} files")
        seen.append(real)
        loaded = _read_file(current)
        has_parent = EXTENDS in loaded
        parent = loaded.pop(EXTENDS, None)
        chain.append((current, loaded))
        if not has_parent:
            return chain[::-1]
        current = _parent_file(parent, current)


def _is_section(dotted: str) -> bool:
    node: Any = DEFAULTS
    for k in dotted.split("."):
        node = node[k]
    return isinstance(node, dict)


def load_config_sources(path: Optional[str] = None, overrides: Iterable[str] = ()) -> tuple:
    """``(cfg, sources)``: the config `load_config` returns and, for every leaf key (dotted), where its
    value came from: ``default``, ``config FILE`` (the file of the chain that set it last) or ``override``.
    ``path`` is a file or a shipped config's name (`resolve_config`); each file may build on another with
    ``extends: NAME|PATH`` (`config_chain`; its keys override the parent's, section by section);
    ``name`` is the file's own (a parent's is not inherited), else the file's stem."""
    cfg = copy.deepcopy(DEFAULTS)
    sources: Dict[str, str] = {}
    if path is not None:
        path = resolve_config(path)
        chain = config_chain(path)
        for i, (file, loaded) in enumerate(chain):
            if i < len(chain) - 1:
                loaded.pop("name", None)
            merge_config(cfg, loaded, DEFAULTS, "", sources, f"config {file}")
        if "name" not in chain[-1][1]:
            stem = os.path.splitext(os.path.basename(path))[0]
            cfg["name"] = re.sub(r"[^A-Za-z0-9._-]", "_", stem).strip(".") or "config"
            sources["name"] = f"config {path}"
    apply_overrides(cfg, overrides, sources)
    validate(cfg)
    check_config_files(cfg)
    leaves: Dict[str, str] = {}

    def walk(node, prefix):
        for k, v in node.items():
            where = f"{prefix}.{k}" if prefix else k
            if _is_section(where):
                walk(v, where)
            else:
                leaves[where] = sources.get(where, "default")
    walk(cfg, "")
    return cfg, leaves


def load_config(path: Optional[str] = None, overrides: Iterable[str] = ()) -> Dict[str, Any]:
    """Defaults <- YAML file (after its ``extends`` chain) <- overrides, validated. ``path`` is a file or a
    shipped config's name (`resolve_config`); ``name`` defaults to the file's stem
    (`load_config_sources`)."""
    return load_config_sources(path, overrides)[0]


def dump_config(cfg: Dict[str, Any]) -> str:
    return yaml.safe_dump(cfg, sort_keys=False)


def _flow(value) -> str:
    """One value as one line of YAML (flow style); a text YAML would fold over lines is written as JSON."""
    text = yaml.safe_dump(value, default_flow_style=True, width=2 ** 31, allow_unicode=True)
    text = text[:-len("...\n")] if text.endswith("\n...\n") else text
    text = text.strip()
    if "\n" in text:
        text = json.dumps(value)
    return text


def dump_config_sources(cfg: Dict[str, Any], sources: Dict[str, str]) -> str:
    """``cfg`` as YAML, each key with a trailing comment saying where its value came from (``sources``, from
    `load_config_sources`); it reads back (`load_yaml`) as ``cfg``."""
    lines = []

    def note(where):
        return sources.get(where, "default").replace("\n", " ").replace("\r", " ")

    for key, value in cfg.items():
        if isinstance(DEFAULTS.get(key), dict):
            lines.append(f"{_flow(key)}:")
            for k, v in value.items():
                lines.append(f"  {_flow(k)}: {_flow(v)}  # {note(key + '.' + k)}")
        else:
            lines.append(f"{_flow(key)}: {_flow(value)}  # {note(key)}")
    return "\n".join(lines) + "\n"


#: the rules between keys that `_check_cross` enforces, in words (for the reference page)
CROSS_RULES = (
    "`model.graph` as a `.npy` edge list: its node ids must be below `data.max_len`.",
    "`model.stop_rel` (not null or 0) applies to encoders that take it (`model.mode=guaranteed`).",
    "`data.listops_*` apply to `data.dataset=listops` only (elsewhere leave them null); there "
    "`listops_min_len <= listops_max_len <= data.max_len` (null: the LRA value).",
    "`train.monitor` warn or strict needs `train.trace=true`.",
    "`data.tokenizer` other than `words` (a subword tokenizer) needs `data.glove=none` and `data.max_vocab=null`.",
    "`data.texts` (checked when a config is loaded, not in a bundle): a readable text file or a folder of `*.txt` "
    "files; `data.tokenizer` as a path: a readable `tokenizer.json`.",
)


def _cell(text: str) -> str:
    """``text`` made safe for one cell of a Markdown table."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _allowed(key: Key) -> str:
    """What values ``key`` accepts, in words, read from its rule (so the page says what is enforced)."""
    rule = key.rule
    if isinstance(rule, Range):
        text = rule.describe()
    elif isinstance(rule, (Text, Checked)):
        text = rule.rule
    elif isinstance(rule, Choice):
        text = "one of " + ", ".join(f"`{name}`" for name in rule.names())
        if rule.source:
            text += f" (registered in `{rule.source}`; a plug-in adds its own)"
    else:
        text = "`true` or `false`"
    return text + (", or `null`" if key.nullable else "")


def _type_name(key: Key) -> str:
    names = {bool: "bool", int: "int", float: "float", str: "str", dict: "mapping"}
    types = key.allowed_types()
    if float in types:                       # an int is read as a float
        types = tuple(t for t in types if t is not int)
    return " or ".join(names.get(t, t.__name__) for t in types) + (" or null" if key.nullable else "")


def reference() -> str:
    """The config reference page (``docs/config_reference.md``): every key of `SCHEMA` with its default,
    type, the values it accepts (its rule's own words and numbers, as `validate` enforces them) and its
    meaning, then the rules between keys. Choice keys list the names registered when it runs."""
    out = ["# Config reference", "",
           "<!-- Generated from the schema (experiments/app/config_schema.py, SCHEMA) by",
           "     python -m experiments.app.config --reference > docs/config_reference.md",
           "     Do not edit by hand: tests/test_config_reference.py fails when this page and the schema differ. -->",
           "",
           "Every key a training config takes. Set a key in a YAML file (`section:` then `key: value`), or on the "
           "command line as `section.key=value` (`--print-config` shows the resolved config and where each value "
           "came from). An unknown key, a value of another type, or a value outside the range below is refused "
           "with a `ConfigError` naming the key. A number key given an integer where it takes a float reads it as "
           "a float.", ""]
    sections = [("Top level", "", {k: v for k, v in SCHEMA.items() if not isinstance(v, dict)})]
    sections += [(f"`{name}`", f"{name}.", node) for name, node in SCHEMA.items() if isinstance(node, dict)]
    for title, prefix, keys in sections:
        out += [f"## {title}", "", "| key | default | type | allowed | meaning |", "|---|---|---|---|---|"]
        for name, key in keys.items():
            out.append(f"| `{prefix}{name}` | `{_cell(_flow(key.default))}` | {_cell(_type_name(key))} | "
                       f"{_cell(_allowed(key))} | {_cell(key.meaning)} |")
        out.append("")
    out += ["## Rules between keys", ""] + [f"- {rule}" for rule in CROSS_RULES] + [""]
    return "\n".join(out)


def main(argv=None) -> int:
    """``python -m experiments.app.config --reference``: print the config reference page."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m experiments.app.config",
                                     description="The training config's schema.")
    parser.add_argument("--reference", action="store_true", required=True,
                        help="print the config reference page (Markdown; docs/config_reference.md)")
    parser.parse_args(argv)
    import sys

    sys.stdout.write(reference())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
