"""The SGLang adapter's calls against the installed SGLang's source (no import, no GPU).

Runs in its own environment, which installs the SGLang wheel without its
dependencies (SGLang cannot be imported here: it needs a CUDA GPU):

    uv run --project tests/engines/sglang pytest tests/engines/sglang

The main environment's ``uv run pytest`` skips this module, naming that command.

Both sides are read with :mod:`ast`: SGLang's files are found through
``importlib.util.find_spec("sglang")`` (the installed package, never
imported) and the adapter's through ``find_spec("rlinf.reasoning")``. Checked:
every ``self._engine.<method>(...)`` call of the adapter names a method of
``sglang.Engine`` (or its bases) and passes only keywords that method accepts,
including all it requires; every key of ``engine_kwargs`` is a ``ServerArgs``
field; every key of ``request_sampling_params`` is a field of SGLang's
``SamplingParams``; the output keys the adapter reads are keys SGLang writes;
and the constants the adapter copies (memory tags, greedy threshold, the
raw-logprob environment variable) are SGLang's. What SGLang does at run time
is not checked here.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import pytest

RUN = "uv run --project tests/engines/sglang pytest tests/engines/sglang"
PINNED = "0.5.23"

if importlib.util.find_spec("sglang") is None:
    pytest.skip(
        f"the SGLang API checks run in their own environment: {RUN}", allow_module_level=True
    )

EXPECTED_CALLS = {
    "begin_weight_update",
    "end_weight_update",
    "flush_cache",
    "generate",
    "release_memory_occupation",
    "resume_memory_occupation",
    "update_weights_from_tensor",
}
"""The ``sglang.Engine`` methods the adapter calls (a change here is a deliberate one)."""


# ---------------------------------------------------------------- locating sources


def sglang_root() -> Path:
    """The installed ``sglang`` package folder (found, not imported)."""
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent


def adapter_path() -> Path:
    """The installed adapter module's file."""
    spec = importlib.util.find_spec("rlinf.reasoning")
    assert spec is not None and spec.submodule_search_locations is not None
    return Path(next(iter(spec.submodule_search_locations))) / "engines" / "sglang_engine.py"


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def module_file(root: Path, module: str) -> Path:
    """The file of ``sglang.x.y`` under the installed package."""
    parts = module.split(".")
    assert parts[0] == "sglang", module
    base = root.joinpath(*parts[1:])
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def find_class(tree: ast.Module, name: str) -> ast.ClassDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise AssertionError(f"no class {name}")


def find_function(tree: ast.Module, name: str) -> ast.FunctionDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise AssertionError(f"no function {name}")


def imported_from(tree: ast.Module, name: str) -> str | None:
    """The module ``name`` is imported from in ``tree`` (``from m import name``)."""
    for node in tree.body:
        if (
            isinstance(node, ast.ImportFrom)
            and node.module is not None
            and any((alias.asname or alias.name) == name for alias in node.names)
        ):
            return node.module
    return None


def engine_class_file(root: Path) -> Path:
    """Where ``sglang.Engine`` is defined: followed from ``sglang/__init__.py``."""
    init = parse(root / "__init__.py")
    for node in init.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "Engine" for t in node.targets
        ):
            # Engine = LazyImport("sglang.srt.entrypoints.engine", "Engine")
            assert isinstance(node.value, ast.Call), ast.unparse(node)
            module, name = (ast.literal_eval(a) for a in node.value.args[:2])
            assert name == "Engine"
            return module_file(root, module)
    module = imported_from(init, "Engine")
    assert module is not None, "sglang/__init__.py does not export Engine"
    return module_file(root, module)


# ---------------------------------------------------------------- signatures


@dataclass(frozen=True)
class Signature:
    """What a method accepts by keyword."""

    params: frozenset[str]
    required: frozenset[str]
    var_kwargs: bool


def signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> Signature:
    args = fn.args
    positional = [*args.posonlyargs, *args.args][1:]  # drop self
    defaults = len(args.defaults)
    required = {a.arg for a in positional[: len(positional) - defaults]}
    required |= {a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None}
    keyword = {a.arg for a in [*args.args[1:], *args.kwonlyargs]}
    return Signature(frozenset(keyword), frozenset(required), args.kwarg is not None)


def class_methods(root: Path, path: Path, name: str) -> dict[str, Signature]:
    """Methods of class ``name`` in ``path``, with those of its bases defined in SGLang."""
    tree = parse(path)
    cls = find_class(tree, name)
    methods: dict[str, Signature] = {}
    for base in reversed(cls.bases):
        if isinstance(base, ast.Name):
            module = imported_from(tree, base.id)
            if module is not None and module.startswith("sglang."):
                methods.update(class_methods(root, module_file(root, module), base.id))
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            methods[node.name] = signature(node)
    return methods


# ---------------------------------------------------------------- the adapter's calls


@dataclass(frozen=True)
class Call:
    """One ``self._engine.<method>(...)`` call of the adapter."""

    method: str
    keywords: tuple[str | None, ...]
    positional: int
    line: int


def engine_calls(tree: ast.Module) -> list[Call]:
    calls = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Attribute)
            and node.func.value.attr == "_engine"
            and isinstance(node.func.value.value, ast.Name)
            and node.func.value.value.id == "self"
        ):
            keywords = tuple(k.arg for k in node.keywords)
            calls.append(Call(node.func.attr, keywords, len(node.args), node.lineno))
    return calls


def check_calls(calls: list[Call], methods: dict[str, Signature]) -> list[str]:
    """What is wrong with the calls (empty: all exist and their keywords are accepted)."""
    problems = []
    for call in calls:
        where = f"line {call.line}: {call.method}"
        sig = methods.get(call.method)
        if sig is None:
            problems.append(f"{where}: sglang.Engine has no method {call.method!r}")
            continue
        if call.positional:
            problems.append(f"{where}: passes positional arguments (keywords only, to be checked)")
        if None in call.keywords:
            problems.append(f"{where}: passes **kwargs (explicit keywords only, to be checked)")
        for keyword in call.keywords:
            if keyword is not None and keyword not in sig.params and not sig.var_kwargs:
                problems.append(
                    f"{where}: sglang.Engine.{call.method} has no parameter {keyword!r}"
                )
        missing = sig.required - set(call.keywords)
        if missing:
            problems.append(f"{where}: does not pass required {sorted(missing)}")
    return problems


def dict_keys(fn: ast.FunctionDef) -> set[str]:
    """String keys of the dict literals and ``d["key"] = ...`` stores in ``fn``."""
    keys: set[str] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Dict):
            keys |= {
                k.value
                for k in node.keys
                if isinstance(k, ast.Constant) and isinstance(k.value, str)
            }
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
        ):
            keys.add(node.slice.value)
    return keys


def read_keys(fn: ast.FunctionDef) -> set[str]:
    """String keys ``fn`` reads: ``x["key"]`` loads and ``x.get("key")``."""
    keys: set[str] = set()
    for node in ast.walk(fn):
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Load)
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
        ):
            keys.add(node.slice.value)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            keys.add(node.args[0].value)
    return keys


def compared_strings(fn: ast.FunctionDef) -> set[str]:
    """String constants ``fn`` compares something with (``kind == "stop"``)."""
    out: set[str] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                if isinstance(side, ast.Constant) and isinstance(side.value, str):
                    out.add(side.value)
    return out


# ---------------------------------------------------------------- SGLang's records


def struct_fields(cls: ast.ClassDef) -> set[str]:
    """Annotated public fields of a class body (msgspec Struct / dataclass fields)."""
    return {
        node.target.id
        for node in cls.body
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and not node.target.id.startswith("_")
    }


def server_args_fields(root: Path) -> set[str]:
    """``ServerArgs``' fields: its own plus those of every namespace in ``_INPUT_NAMESPACES``."""
    path = root / "srt" / "server_args.py"
    tree = parse(path)
    fields = struct_fields(find_class(tree, "ServerArgs"))
    namespaces = next(
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "_INPUT_NAMESPACES" for t in node.targets)
    )
    assert isinstance(namespaces, ast.List)
    for element in namespaces.elts:
        assert isinstance(element, ast.Name)
        module = imported_from(tree, element.id)
        assert module is not None, element.id
        fields |= struct_fields(find_class(parse(module_file(root, module)), element.id))
    return fields


def module_constants(tree: ast.Module) -> dict[str, object]:
    """Module-level ``NAME = <literal>`` assignments (names resolved within the module)."""
    out: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = node.value
            if value is None:
                continue
            if isinstance(value, ast.List | ast.Tuple):
                items = [out.get(e.id) if isinstance(e, ast.Name) else None for e in value.elts]
                if all(i is not None for i in items):
                    literal: object = tuple(items)
                else:
                    try:
                        literal = tuple(ast.literal_eval(value))
                    except ValueError:
                        continue
            else:
                try:
                    literal = ast.literal_eval(value)
                except ValueError:
                    continue
            for target in targets:
                if isinstance(target, ast.Name):
                    out[target.id] = literal
    return out


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def root() -> Path:
    return sglang_root()


@pytest.fixture(scope="module")
def adapter() -> ast.Module:
    return parse(adapter_path())


@pytest.fixture(scope="module")
def engine_methods(root: Path) -> dict[str, Signature]:
    return class_methods(root, engine_class_file(root), "Engine")


# ---------------------------------------------------------------- tests


def test_installed_sglang_is_the_pinned_version(root: Path) -> None:
    assert importlib.metadata.version("sglang") == PINNED
    version = module_constants(parse(root / "_version.py")).get("__version__")
    assert version == PINNED, f"sglang/_version.py says {version}"


def test_every_engine_call_exists_with_its_keywords(
    adapter: ast.Module, engine_methods: dict[str, Signature]
) -> None:
    calls = engine_calls(adapter)
    assert {c.method for c in calls} == EXPECTED_CALLS
    assert check_calls(calls, engine_methods) == []
    for call in calls:  # what was checked, shown with -rA or -s
        accepted = engine_methods[call.method]
        print(
            f"Engine.{call.method}({', '.join(k or '**' for k in call.keywords)}) "
            f"-> accepts {sorted(accepted.params)}"
        )


def test_engine_is_built_from_engine_kwargs_only(adapter: ast.Module) -> None:
    # The one constructor call is sglang.Engine(**kwargs) with kwargs = engine_kwargs(...).
    uses = [
        node
        for node in ast.walk(adapter)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "sglang"
    ]
    assert [u.attr for u in uses] == ["Engine"]
    init = next(
        node
        for node in ast.walk(find_class(adapter, "SGLangEngine"))
        if isinstance(node, ast.FunctionDef) and node.name == "__init__"
    )
    (ctor,) = [
        node
        for node in ast.walk(init)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "Engine"
    ]
    assert not ctor.args and len(ctor.keywords) == 1 and ctor.keywords[0].arg is None
    splat = ctor.keywords[0].value
    assert isinstance(splat, ast.Name)
    sources = [
        node.value
        for node in ast.walk(init)
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == splat.id for t in node.targets)
    ]
    assert len(sources) == 1 and isinstance(sources[0], ast.Call)
    assert ast.unparse(sources[0].func) == "engine_kwargs"


def test_engine_kwargs_are_server_args_fields(adapter: ast.Module, root: Path) -> None:
    fields = server_args_fields(root)
    assert {"model_path", "mem_fraction_static", "enable_memory_saver"} <= fields  # sanity
    keys = dict_keys(find_function(adapter, "engine_kwargs"))
    assert "skip_tokenizer_init" in keys and "enable_memory_saver" in keys
    assert sorted(keys - fields) == []


def test_sampling_keys_are_sglang_sampling_params_fields(adapter: ast.Module, root: Path) -> None:
    tree = parse(root / "srt" / "sampling" / "sampling_params.py")
    fields = struct_fields(find_class(tree, "SamplingParams"))
    keys = dict_keys(find_function(adapter, "request_sampling_params"))
    assert {"top_k", "sampling_seed", "stop_token_ids"} <= keys
    assert sorted(keys - fields) == []


def test_top_k_minus_one_is_sglangs_whole_vocabulary(root: Path) -> None:
    # SamplingParams.__post_init__: ``if self.top_k == -1: self.top_k = TOP_K_ALL``
    # (and verify() rejects 0), which is why the adapter maps 0 to -1.
    cls = find_class(parse(root / "srt" / "sampling" / "sampling_params.py"), "SamplingParams")
    post_init = next(
        n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__post_init__"
    )
    found = [
        node
        for node in ast.walk(post_init)
        if isinstance(node, ast.If)
        and ast.unparse(node.test) == "self.top_k == -1"
        and ast.unparse(node.body[0]) == "self.top_k = TOP_K_ALL"
    ]
    assert found


def test_output_keys_are_written_by_sglang(adapter: ast.Module, root: Path) -> None:
    convert = find_function(adapter, "convert_outputs")
    read = read_keys(convert)
    assert {"output_ids", "meta_info", "finish_reason", "output_token_logprobs", "type"} <= read
    written: set[str] = set()
    type_values: set[str] = set()
    for rel in ("srt/managers/tokenizer_manager.py", "srt/managers/schedule_batch.py"):
        tree = parse(root / rel)
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                for k, v in zip(node.keys, node.values, strict=True):
                    if isinstance(k, ast.Constant) and isinstance(k.value, str):
                        written.add(k.value)
                        if k.value == "type" and isinstance(v, ast.Constant):
                            type_values.add(str(v.value))
            elif (
                isinstance(node, ast.Subscript)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.slice, ast.Constant)
                and isinstance(node.slice.value, str)
            ):
                written.add(node.slice.value)
    assert sorted(read - written) == []
    # The finish reasons the adapter tells apart are the "type"s of SGLang's FINISH_* to_json.
    assert sorted(compared_strings(convert) - type_values) == []
    assert {"stop", "length", "abort"} <= type_values


def test_output_ids_run_through_the_stop_token(root: Path) -> None:
    # The scheduler sends output_ids_through_stop ("Stop position is included"),
    # so output_ids end with the stop token, as the adapter's contract says.
    streamer = (root / "srt/managers/scheduler_components/output_streamer.py").read_text()
    assert "output_ids_ = req.output_ids_through_stop" in streamer
    batch = find_class(parse(root / "srt/managers/schedule_batch.py"), "Req")
    prop = next(
        n
        for n in batch.body
        if isinstance(n, ast.FunctionDef) and n.name == "output_ids_through_stop"
    )
    assert "Stop position is included" in (ast.get_docstring(prop) or "")


def test_copied_constants_match_sglang(adapter: ast.Module, root: Path) -> None:
    ours = module_constants(adapter)
    constants = module_constants(parse(root / "srt" / "constants.py"))
    assert set(ours["MEMORY_TAGS"]) == set(constants["GPU_MEMORY_ALL_TYPES"])  # type: ignore[call-overload]
    assert ours["_WEIGHTS"] == constants["GPU_MEMORY_TYPE_WEIGHTS"]
    sampling = module_constants(parse(root / "srt" / "sampling" / "sampling_params.py"))
    assert ours["_GREEDY_TEMPERATURE"] == sampling["_SAMPLING_EPS"]
    sampler = (root / "srt" / "layers" / "sampler.py").read_text()
    assert f'get_bool_env_var("{ours["_ORIGINAL_LOGPROB_ENV"]}")' in sampler


def test_sampler_logprobs_are_tempered_before_filtering_except_greedy(root: Path) -> None:
    # The logprob convention the adapter documents, as SGLang's Sampler.forward
    # computes it: the standard path divides the logits by the temperature,
    # takes the softmax, samples, and returns log(probs) of that softmax;
    # the greedy path returns log_softmax of the raw logits.
    sampler = find_class(parse(root / "srt" / "layers" / "sampler.py"), "Sampler")
    forward = ast.unparse(
        next(n for n in sampler.body if isinstance(n, ast.FunctionDef) and n.name == "forward")
    )
    greedy = forward.index("if sampling_info.is_all_greedy:")
    standard = forward.index("logits.div_(sampling_info.temperatures)")
    assert (
        "original_logprobs = logprobs = torch.nn.functional.log_softmax(logits, dim=-1)"
        in (forward[greedy:standard])
    )
    assert "else torch.log(probs)" in forward[standard:]


def test_pytorch_sampler_filters_a_copy_of_the_probabilities(root: Path) -> None:
    # log(probs) is taken after sampling, so the sampler must not filter probs in
    # place. SGLang's PyTorch sampler writes only to its sorted copy (FlashInfer's
    # CUDA kernel, the default where installed, cannot be read here).
    tree = parse(root / "srt" / "layers" / "sampler.py")
    fn = find_function(tree, "top_k_top_p_min_p_sampling_from_probs_torch")
    writes = [
        ast.unparse(node)
        for node in ast.walk(fn)
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Store)
            and ast.unparse(node.value) == "probs"
        )
        or (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and ast.unparse(node.func.value) == "probs"
            and node.func.attr.endswith("_")
        )
    ]
    assert writes == []
    assert "probs_sort, probs_idx = probs.sort(dim=-1, descending=True)" in ast.unparse(fn)


def test_the_checker_reports_mistakes(root: Path, engine_methods: dict[str, Signature]) -> None:
    # A small adapter with a misspelled method, a misspelled keyword, a missing
    # required argument, a positional argument and a **splat: each is reported.
    source = ast.parse(
        "class A:\n"
        "    def f(self, tensors, kw):\n"
        "        self._engine.genrate(input_ids=[[1]])\n"
        "        self._engine.update_weights_from_tensor(named_tensor=tensors)\n"
        "        self._engine.release_memory_occupation(['weights'])\n"
        "        self._engine.flush_cache(**kw)\n"
        "        self._engine.generate(input_ids=[[1]], sampling_params={}, return_logprob=True)\n"
    )
    problems = check_calls(engine_calls(source), engine_methods)
    assert problems == [
        "line 3: genrate: sglang.Engine has no method 'genrate'",
        "line 4: update_weights_from_tensor: sglang.Engine.update_weights_from_tensor has no "
        "parameter 'named_tensor'",
        "line 4: update_weights_from_tensor: does not pass required ['named_tensors']",
        "line 5: release_memory_occupation: passes positional arguments (keywords only, to be "
        "checked)",
        "line 6: flush_cache: passes **kwargs (explicit keywords only, to be checked)",
    ]
    bad_kwargs = ast.parse("def engine_kwargs():\n    return {'model_path': 1, 'mem_frac': 2}\n")
    keys = dict_keys(find_function(bad_kwargs, "engine_kwargs"))
    assert sorted(keys - server_args_fields(root)) == ["mem_frac"]
