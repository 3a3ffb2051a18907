"""The API reference (docs/api/*.md) renders every public name of the four packages.

A module's public API is its ``__all__``. For every public module (no path
component starting with ``_``) that declares one, each exported name must be
rendered by some ``::: identifier`` directive of ``docs/api/*.md``: the module's
own directive, or a directive of another module that exports the same object
(a package re-export). Rendering is computed the way mkdocstrings-python selects
members: the directive's ``members`` list if given, else the ``filters``
(``public``: what ``__all__`` exports) and ``show_if_no_docstring``, with the
global options of ``mkdocs.yml`` under the local ones. Objects are compared by
the path griffe resolves them to, statically, as mkdocstrings does; the site is
not built (``mkdocs build --strict`` in ``.ci/lint`` does that).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import griffe
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
API_DIR = ROOT / "docs" / "api"
PACKAGES = ("rlinf.core", "rlinf.sched", "rlinf.embodied", "rlinf.reasoning")
DIRECTIVE = re.compile(r"^:::\s+(\S+)\s*$")


class _TolerantLoader(yaml.SafeLoader):
    """Reads mkdocs.yml, whose ``!!python/name:`` and ``!ENV`` tags safe_load refuses."""


def _ignore_tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> None:
    return None


_TolerantLoader.add_multi_constructor("tag:yaml.org,2002:python/", _ignore_tag)
_TolerantLoader.add_multi_constructor("!", _ignore_tag)


@dataclass
class Directive:
    page: str
    identifier: str
    options: dict[str, Any]


def _mkdocs_config() -> dict[str, Any]:
    config: dict[str, Any] = yaml.load(
        (ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_TolerantLoader
    )
    return config


def _python_handler(config: dict[str, Any]) -> dict[str, Any]:
    for plugin in config.get("plugins") or []:
        if isinstance(plugin, dict) and "mkdocstrings" in plugin:
            handler: dict[str, Any] = plugin["mkdocstrings"]["handlers"]["python"]
            return handler
    raise AssertionError("mkdocs.yml has no mkdocstrings plugin with a python handler")


def _directives(global_options: dict[str, Any]) -> list[Directive]:
    found = []
    for page in sorted(API_DIR.glob("*.md")):
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            match = DIRECTIVE.match(line)
            if not match:
                continue
            block = []
            for follow in lines[i + 1 :]:
                if follow.strip() and not follow.startswith(" "):
                    break
                block.append(follow)
            local = yaml.safe_load("\n".join(block)) if any(b.strip() for b in block) else None
            options = dict(global_options)
            options.update((local or {}).get("options") or {})
            found.append(Directive(page.name, match.group(1), options))
    return found


def _canonical(obj: griffe.Object | griffe.Alias) -> str:
    return obj.final_target.path if isinstance(obj, griffe.Alias) else obj.path


def _keep_by_filters(name: str, filters: list[str]) -> bool:
    # mkdocstrings-python's rule: the last matching filter decides; "!" excludes.
    keep = None
    kinds = set()
    for pattern in filters:
        exclude = pattern.startswith("!")
        kinds.add(exclude)
        if re.search(pattern[1:] if exclude else pattern, name):
            keep = not exclude
    if keep is None:
        return kinds != {False}
    return keep


def _rendered_members(module: griffe.Module, options: dict[str, Any]) -> list[str]:
    members = options.get("members")
    objects = list(module.members.values())
    if members is True:
        return [_canonical(o) for o in objects]
    if members is False or members == []:
        return []
    if isinstance(members, list):
        return [_canonical(o) for o in objects if o.name in set(members)]
    filters = options.get("filters", ["!^_[^_]"])
    if filters == "public":
        objects = [o for o in objects if o.is_public]
    else:
        objects = [o for o in objects if _keep_by_filters(o.name, filters)]
        # Imported objects are rendered only when exported.
        objects = [o for o in objects if not o.is_imported or o.is_public]
    if not options.get("show_if_no_docstring", False):
        objects = [o for o in objects if o.has_docstrings]
    # Submodules are rendered only with show_submodules; none count as API names here.
    return [_canonical(o) for o in objects if not o.is_module]


@pytest.fixture(scope="module")
def reference() -> tuple[dict[str, griffe.Module], set[str], list[Directive]]:
    config = _mkdocs_config()
    handler = _python_handler(config)
    paths = [str(ROOT / p) for p in handler.get("paths", ["."])]
    options = handler.get("options") or {}
    loader = griffe.GriffeLoader(search_paths=paths)
    for package in PACKAGES:
        loader.load(package)
    loader.resolve_aliases(implicit=False, external=None)
    collection = loader.modules_collection

    public: dict[str, griffe.Module] = {}

    def walk(module: griffe.Module) -> None:
        if any(part.startswith("_") for part in module.path.split(".")):
            return
        if module.exports is not None:
            public[module.path] = module
        for sub in module.modules.values():
            if not sub.is_alias:
                walk(sub)

    for package in PACKAGES:
        walk(collection[package])

    directives = _directives(options)
    rendered: set[str] = set()
    for directive in directives:
        obj = collection[directive.identifier]
        if obj.is_module:
            rendered.update(_rendered_members(obj, directive.options))
        else:
            rendered.add(_canonical(obj))
    return public, rendered, directives


def test_the_reference_is_configured_and_in_the_nav() -> None:
    config = _mkdocs_config()
    handler = _python_handler(config)
    for package in ("core", "sched", "embodied", "reasoning"):
        assert f"packages/rlinf-{package}/src" in handler["paths"]
    nav = yaml.safe_dump(config["nav"])
    pages = sorted(p.name for p in API_DIR.glob("*.md"))
    assert pages, "docs/api/ has no pages"
    for page in pages:
        assert f"api/{page}" in nav, f"docs/api/{page} is not in mkdocs.yml's nav"


def test_every_directive_names_an_object(
    reference: tuple[dict[str, griffe.Module], set[str], list[Directive]],
) -> None:
    _, _, directives = reference
    assert directives, "docs/api/*.md has no ::: directives"
    for package in PACKAGES:
        assert any(d.identifier.startswith(package) for d in directives), package
    for directive in directives:
        root = ".".join(directive.identifier.split(".")[:2])
        assert root in PACKAGES, f"{directive.page}: ::: {directive.identifier} is outside RLinf"


def test_every_exported_name_is_rendered(
    reference: tuple[dict[str, griffe.Module], set[str], list[Directive]],
) -> None:
    public, rendered, _ = reference
    assert len(public) > 20, sorted(public)
    missing = []
    for path, module in sorted(public.items()):
        for export in module.exports or []:
            name = export if isinstance(export, str) else export.name
            try:
                target = _canonical(module[name])
            except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
                missing.append(f"{path}.{name} (in __all__ but not defined)")
                continue
            if target not in rendered:
                missing.append(f"{path}.{name}")
    assert not missing, (
        "public names missing from the API reference (add a `::: module` directive to "
        "docs/api/<package>.md, or the name to that directive's `members:` list):\n  "
        + "\n  ".join(missing)
    )
