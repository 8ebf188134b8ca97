"""The encoders of generated text (``emitters/encode.py``, issue 21 part 1), in the fast tier.

* each encoder, fuzzed (hypothesis) with any text, reads back as the same value with that format's
  own reader: ``ast.literal_eval`` for Python literals and docstrings, ``yaml.safe_load`` for YAML
  scalars, ``shlex.split`` for shell words, ``json.loads`` for JSON; a one-line text has no line break;
* an ``#SBATCH`` value is written only from its safe alphabet, and anything else is refused by name;
* the emitted torchtitan job module, for a plan whose model and cluster names are hostile text, holds
  only imports, function definitions, literals and calls of a whitelisted set of constructors (read
  with ``ast``): a name can be data, never code. Running it under an audit hook is in
  ``test_emit_safety.py`` (it starts a process).
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import json
import math
import os
import re
import shlex

import pytest
import yaml

from emitters import encode
from emitters.encode import EncodeError

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

settings.register_profile("ci", derandomize=True, deadline=None, database=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
_SCALE = int(os.environ.get("FUZZ_SCALE", "1"))


def examples(n: int):
    return settings(max_examples=n * _SCALE)


# text that tries to leave a string: quotes of every kind, backslashes, line breaks of every kind,
# bidi overrides, NUL, surrogates, and code
HOSTILE = ['"""', "'''", '"', "'", "\\", "\n", "\r", "\x85", "\u2028", "\u2029", "\u202e", "\x00", "\ud800",
           "$(touch PWNED)", "`touch PWNED`", '__import__("os").system("touch PWNED")', "#", "---", ": ", "{",
           "\t", "\ufeff", "\U0001f600", "%", "&", "<script>", "]]>", "\\N{BULLET}", "\\x41", "\\u0041"]
TEXT = st.lists(st.one_of(st.sampled_from(HOSTILE), st.text(max_size=6)), max_size=8).map("".join)

LITERAL = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False), TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.lists(inner, max_size=4).map(tuple),
                            st.dictionaries(st.one_of(TEXT, st.integers()), inner, max_size=4)),
    max_leaves=12)


@examples(300)
@given(value=LITERAL)
def test_py_literal_reads_back(value):
    text = encode.py_literal(value)
    tree = ast.parse(text, mode="eval")
    assert _only_literals(tree.body), text
    assert ast.literal_eval(text) == value


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, object(), {1, 2}, b"x", 1j,
                                   dataclasses.make_dataclass("X", [])()])
def test_py_literal_refuses_what_has_no_literal(value):
    with pytest.raises(EncodeError, match="literal|finite"):
        encode.py_literal(value, "field")


def test_py_code_is_written_as_is():
    assert encode.py_literal([encode.PyCode("FullAC.Config()"), 1]) == "[FullAC.Config(), 1]"


@examples(300)
@given(text=TEXT)
def test_py_docstring_is_one_literal(text):
    src = encode.py_docstring(text)
    module = ast.parse(src + "\nX = 1\n")
    assert len(module.body) == 2 and isinstance(module.body[0], ast.Expr)
    assert ast.literal_eval(src) == text
    assert ast.get_docstring(module, clean=False) == text


@examples(300)
@given(text=TEXT)
def test_comment_and_one_line_hold_no_line_break(text):
    line = encode.one_line(text)
    assert len(line.splitlines()) <= 1 and "\n" not in line and "\r" not in line
    for comment in (encode.py_comment(text),):
        for row in comment.splitlines():
            assert row.startswith("#")
        tree = ast.parse(comment + "X = 1\n")
        assert len(tree.body) == 1          # the comment is a comment, whatever it says


@examples(300)
@given(text=TEXT)
def test_sh_is_one_word(text):
    if "\x00" in text:      # a shell word cannot hold NUL: the emitters never pass one (names are one_line'd)
        text = text.replace("\x00", "")
    assert shlex.split(encode.sh(text)) == [text]


@examples(300)
@given(text=TEXT)
def test_yaml_scalar_reads_back(text):
    doc = yaml.safe_load("key: " + encode.yaml_scalar(text) + "\nother: 1\n")
    assert doc == {"key": text, "other": 1}


@examples(100)
@given(value=LITERAL)
def test_json_text_reads_back_or_refuses(value):
    try:
        text = encode.json_text(value)
    except (TypeError, EncodeError):
        return      # tuples become lists, int keys become strings: the comparison below is for JSON data
    assert json.loads(text) is not None or value is None


def test_json_refuses_nan():
    with pytest.raises(EncodeError, match="NaN and infinity"):
        encode.json_text({"a": math.nan})


def test_html_text():
    assert encode.html_text('<a href="x">&\'') == "&lt;a href=&quot;x&quot;&gt;&amp;&#x27;"


@pytest.mark.parametrize("flag,value", [("account", "proj-123_ab"), ("partition", "gpu,h100"),
                                        ("time", "1-00:00:00"), ("gres", "gpu:8"), ("output", "%x-%j.out"),
                                        ("nodelist", "node[1-4]"), ("qos", "high"), ("exclusive", None)])
def test_sbatch_option_writes_site_values(flag, value):
    line = encode.sbatch_option(flag, value)
    assert line == f"#SBATCH --{flag}" + ("" if value is None else f"={value}") + "\n"


@examples(300)
@given(value=TEXT)
def test_sbatch_option_fuzz(value):
    """Either one #SBATCH line whose value is exactly the input, or a refusal naming the field."""
    try:
        line = encode.sbatch_option("account", value, field="--account")
    except EncodeError as e:
        assert str(e).startswith("--account = ") and "letters, digits" in str(e)
        assert "\n" not in str(e)
        return
    assert line.count("\n") == 1 and line.endswith("\n")
    assert line == f"#SBATCH --account={value}\n"
    assert not set(value) & set(" \t'\"$`;\\&|<>()#*?~!{}")


@pytest.mark.parametrize("flag", ["Account", "a b", "x\n", "--time", ""])
def test_sbatch_option_refuses_bad_flag_names(flag):
    with pytest.raises(EncodeError):
        encode.sbatch_option(flag, "x")


# --------------------------------------------------------------------------------------
# The emitted torchtitan job module, read with ast
# --------------------------------------------------------------------------------------

# Callables the job module may call: torchtitan's config constructors and helpers it imports, and
# the builtins the model code uses. Anything else (``__import__``, ``exec``, ``os.system``,
# ``open``, a getattr chain reaching them) fails the test.
ALLOWED_CALLS = {
    "Trainer.Config", "ChunkedLossWrapper.Config", "CrossEntropyLoss.Config", "OptimizersContainer.Config",
    "ParamGroupConfig", "LRSchedulersContainer.Config", "TrainingConfig", "HuggingFaceTextDataLoader.Config",
    "ParallelismConfig", "DebugConfig", "FullAC.Config", "SelectiveAC.Config", "CompileConfig", "model_registry",
    "CheckpointManager.Config",
    "decoder_vocab_size",
    "Llama3Model.Config", "_build_llama3_layers", "ComplexRoPE.Config", "Embedding.Config", "RMSNorm.Config",
    "Linear.Config", "_output_linear_init",
    "Float8LinearConverter.Config", "MTPLoss.Config",       # Float8 plans; DeepSeek-V3's multi-token prediction
}
ALLOWED_MODULES = ("torchtitan.",)


def _dotted(node) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return _dotted(node.value) + "." + node.attr
    return "<expr>"


def _only_literals(node) -> bool:
    return all(isinstance(n, (ast.Constant, ast.List, ast.Tuple, ast.Dict, ast.Load, ast.UnaryOp, ast.USub,
                              ast.UAdd)) for n in ast.walk(node))


def check_job_module(src: str) -> None:
    """Fail unless the module is: a docstring, imports from torchtitan, function definitions whose
    bodies call only whitelisted constructors, and one registration of the custom flavor."""
    tree = ast.parse(src)
    body = tree.body
    assert isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant), "no docstring first"
    for stmt in body[1:]:
        if isinstance(stmt, ast.ImportFrom):
            assert (stmt.module or "").startswith(ALLOWED_MODULES) or stmt.module == "__future__", stmt.module
        elif isinstance(stmt, ast.FunctionDef):
            pass
        elif isinstance(stmt, ast.Assign):      # llama3_configs['planner'] = _planner_model
            assert isinstance(stmt.value, ast.Name) and stmt.value.id == "_planner_model", ast.dump(stmt)
            (target,) = stmt.targets
            assert isinstance(target, ast.Subscript) and _dotted(target.value) == "llama3_configs"
            assert _only_literals(target.slice)
        else:
            raise AssertionError(f"top-level statement {type(stmt).__name__} at line {stmt.lineno}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            assert _dotted(node.func) in ALLOWED_CALLS, f"call of {_dotted(node.func)} at line {node.lineno}"
        if isinstance(node, (ast.Import, ast.Global, ast.Nonlocal, ast.Lambda, ast.Delete, ast.With,
                             ast.Try, ast.While, ast.AsyncFunctionDef, ast.ClassDef)):
            raise AssertionError(f"{type(node).__name__} at line {node.lineno}")
        if isinstance(node, ast.Attribute):
            assert not node.attr.startswith("__"), f"dunder attribute {node.attr} at line {node.lineno}"
        if isinstance(node, ast.Name):
            assert not node.id.startswith("__"), f"dunder name {node.id} at line {node.lineno}"
    # the only strings a call receives are literals: a keyword argument's value is a literal, a
    # whitelisted call, a name bound in the module, or arithmetic of those
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            raise AssertionError(f"f-string at line {node.lineno}")


def _with_names(plan, model_name: str, cluster_name: str):
    def renamed(obj, **fields):
        new = dataclasses.replace(obj)
        for k, v in fields.items():
            object.__setattr__(new, k, v)
        new.__dict__.pop("_hash", None)
        return new
    return renamed(plan, model=renamed(plan.model, name=model_name),
                   cluster=renamed(plan.cluster, name=cluster_name))


@functools.cache
def _torchtitan_plans() -> tuple:
    from emitters import CannotExpress, get
    from test_emit_support import examples as example_plans
    out = []
    for name, plan in sorted(example_plans().items()):
        try:
            get("torchtitan").emit(plan)
        except CannotExpress:
            continue
        out.append(plan)
    assert out, "no example plan that torchtitan writes"
    return tuple(out)


PAYLOAD = 'cpu"""; __import__("os").system("touch PWNED"); """'


def test_issue_payload_stays_a_docstring():
    from emitters import torchtitan
    for plan in _torchtitan_plans():
        src = torchtitan.emit(_with_names(plan, PAYLOAD, PAYLOAD))["torchtitan_planner_job.py"]
        check_job_module(src)
        assert PAYLOAD in ast.get_docstring(ast.parse(src), clean=False)


@examples(60)
@given(model_name=TEXT, cluster_name=TEXT, which=st.integers(0, 100))
def test_emitted_python_fuzz(model_name, cluster_name, which):
    from emitters import torchtitan
    plans = _torchtitan_plans()
    plan = _with_names(plans[which % len(plans)], model_name, cluster_name)
    check_job_module(torchtitan.emit(plan)["torchtitan_planner_job.py"])


def test_check_job_module_catches_code():
    """The checker itself: each of these lines, added to a real emitted module, must fail it."""
    from emitters import torchtitan
    src = torchtitan.emit(_torchtitan_plans()[0])["torchtitan_planner_job.py"]
    check_job_module(src)
    for bad in ['__import__("os").system("x")', "import os", "x = open('f', 'w')",
                "def f():\n    return eval('1')", "exec('1')", "llama3_configs['a'] = print",
                "def g():\n    return ParallelismConfig.__class__"]:
        with pytest.raises(AssertionError):
            check_job_module(src + "\n" + bad + "\n")


# --------------------------------------------------------------------------------------
# Every emitter's every file, fuzzed with hostile names
# --------------------------------------------------------------------------------------

_SBATCH_LINE = re.compile(r"#SBATCH --[a-z][a-z0-9-]*(=" + encode.SBATCH_VALUE.pattern + r")?")


@functools.cache
def _plans_by_target() -> dict:
    from emitters import TARGETS, CannotExpress, get
    from test_emit_support import examples as example_plans
    out = {}
    for target in TARGETS:
        for _, plan in sorted(example_plans().items()):
            try:
                get(target).emit(plan)
            except CannotExpress:
                continue
            out[target] = plan
            break
    return out


def _outside_quotes_and_comments(script: str, needle: str) -> list[int]:
    """Offsets of ``needle`` that bash would read as code or expand: not in a comment, not in single
    quotes (the emitters quote every value with ``shlex.quote``: single quotes; inside double
    quotes ``$(...)`` would still run, so a needle there counts)."""
    out, i, n, state = [], 0, len(script), "code"
    while i < n:
        c = script[i]
        if state == "code":
            if script.startswith(needle, i):
                out.append(i)
            if c == "#" and (i == 0 or script[i - 1] in " \t\n;"):
                j = script.find("\n", i)
                i = n if j < 0 else j
                continue
            if c == "'":
                state = "squote"
            elif c == '"':
                state = "dquote"
            elif c == "\\":
                i += 1
        elif state == "squote":
            if c == "'":
                state = "code"
        else:
            if script.startswith(needle, i):
                out.append(i)
            if c == "\\":
                i += 1
            elif c == '"':
                state = "code"
        i += 1
    return out


@examples(40)
@given(model_name=TEXT, cluster_name=TEXT, target=st.sampled_from(
    ["torchrun", "slurm", "kubernetes", "megatron", "deepspeed", "torchtitan", "accelerate", "vllm", "sglang",
     "tensorrt-llm"]))
def test_emitted_files_fuzz(model_name, cluster_name, target):
    """Any model and cluster name (made of quotes, line breaks, ``$(...)``, code): every emitted
    file keeps it as data. Python: the ast whitelist; YAML and JSON: they parse, and the
    PyTorchJob keeps its shape; shell: the marker never reaches code; #SBATCH: every directive is
    one option from the safe alphabet."""
    from emitters import get
    plans = _plans_by_target()
    if target not in plans:
        pytest.skip(f"no example plan that {target} writes")
    marker = "PWNEDMARK"
    plan = _with_names(plans[target], model_name + marker, marker + cluster_name)
    files = get(target).emit(plan)
    for name, text in files.items():
        if name in ("train_deepspeed.py", "train_accelerate.py"):   # starting-point scripts: names only in comments
            ast.parse(text)
            assert all(line.lstrip().startswith("#") for line in text.splitlines() if marker in line)
        elif name.endswith(".py"):
            check_job_module(text)
        elif name.endswith((".yaml", ".yml")):
            docs = list(yaml.safe_load_all(text))
            if name == "pytorchjob.yaml":
                assert [d["kind"] for d in docs] == ["ConfigMap", "PyTorchJob"]
                assert set(docs[1]) == {"apiVersion", "kind", "metadata", "spec"}
                assert marker not in json.dumps(docs[1])          # the job itself never holds the name
        elif name.endswith(".json"):
            json.loads(text)
        elif name.endswith((".sh", ".sbatch")):
            assert _outside_quotes_and_comments(text, marker) == [], (name, text)
            for line in text.splitlines():
                if line.startswith("#SBATCH"):
                    assert _SBATCH_LINE.fullmatch(line), line
