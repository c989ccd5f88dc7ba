"""Prove that no traced function of a training run calls back into Python.

A ``tf.py_function`` in a ``tf.data`` map (or in a step function) runs Python under the GIL on
every element, serializes the input pipeline and, under ``MirroredStrategy``, can hang
``model.fit`` outright (the incident genaug started from). This module walks op types instead
of trusting code review:

* the dataset graph as TensorFlow serializes it (``Dataset._as_serialized_graph``), including
  every function in its library (map, filter, flat_map, interleave bodies and the functions
  they call);
* the concrete functions traced for a Keras model's compiled train / test / predict steps,
  including the functions nested inside them.

Flagged op types are in :data:`PYTHON_OP_TYPES`: ``PyFunc`` (``tf.numpy_function``,
``tf.compat.v1.py_func``), ``PyFuncStateless``, ``EagerPyFunc`` (``tf.py_function``),
``NumpyFunction`` should a TensorFlow version emit it, and ``GeneratorDataset``
(``Dataset.from_generator`` pulls each element from a Python generator through ``PyFunc``).

Example::

    from genaug.trainer import assert_no_python_ops
    assert_no_python_ops(dataset=train_ds, model=model)   # raises PythonInGraphError
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

__all__ = [
    "PYTHON_OP_TYPES",
    "Finding",
    "PythonInGraphError",
    "assert_no_python_ops",
    "python_ops_in_dataset",
    "python_ops_in_graph_def",
    "python_ops_in_model",
    "step_functions",
    "tracing_counts",
]

log = logging.getLogger(__name__)

PYTHON_OP_TYPES: dict[str, str] = {
    "PyFunc": "calls Python (tf.numpy_function / tf.compat.v1.py_func)",
    "PyFuncStateless": "calls Python (stateless py_func)",
    "EagerPyFunc": "calls Python (tf.py_function)",
    "NumpyFunction": "calls Python (numpy_function)",
    "GeneratorDataset": "pulls elements from a Python generator (Dataset.from_generator)",
}
"""Op type -> why it is flagged."""

_STEPS = ("train", "test", "predict")


@dataclass(frozen=True)
class Finding:
    """One op that calls back into Python.

    Attributes:
        op_type: e.g. ``"EagerPyFunc"``.
        node: the node's name inside its function or graph.
        function: the function holding the node (``None`` for the top-level graph).
        where: what was audited, e.g. ``"dataset"`` or ``"train step"``.
        path: the chain of functions/nodes leading to ``function`` from the top level.
        reason: why the op type is flagged.
    """

    op_type: str
    node: str
    function: str | None
    where: str
    path: tuple[str, ...] = ()
    reason: str = ""

    def __str__(self) -> str:
        loc = f"function {self.function!r}" if self.function else "top-level graph"
        via = f" (via {' -> '.join(self.path)})" if self.path else ""
        return f"{self.where}: {self.op_type} node {self.node!r} in {loc}{via}: {self.reason}"


class PythonInGraphError(AssertionError):
    """Raised by :func:`assert_no_python_ops`; ``findings`` lists every offending op."""

    def __init__(self, findings: Sequence[Finding]) -> None:
        self.findings = list(findings)
        lines = "\n  ".join(str(f) for f in self.findings)
        super().__init__(
            f"{len(self.findings)} op(s) call back into Python inside traced functions:\n  "
            f"{lines}\nMove that work out of the graph (genaug: a feeder thread writes a "
            "SyntheticReservoir; the map samples it with graph ops)."
        )


# --------------------------------------------------------------------------------- GraphDefs


def _func_refs(node: Any) -> Iterator[str]:
    """Names of functions a NodeDef refers to through its attributes."""
    for attr in node.attr.values():
        if attr.HasField("func"):
            yield attr.func.name
        if attr.HasField("list"):
            for f in attr.list.func:
                yield f.name
    # Calls to library functions can also appear as the op type itself.
    yield node.op


def python_ops_in_graph_def(
    graph_def: Any, where: str, *, op_types: Iterable[str] = PYTHON_OP_TYPES
) -> list[Finding]:
    """Findings in a ``GraphDef`` and every function of its library.

    Each finding's ``path`` names the top-level node and the functions through which the
    offending function is reached (the first such chain found).
    """
    flagged = set(op_types)
    library = {f.signature.name: f for f in graph_def.library.function}

    # Breadth-first from the top-level nodes, remembering how each function was reached.
    paths: dict[str, tuple[str, ...]] = {}
    frontier: list[tuple[str, tuple[str, ...]]] = []
    for node in graph_def.node:
        for ref in _func_refs(node):
            if ref in library and ref not in paths:
                paths[ref] = (f"{node.op} {node.name!r}",)
                frontier.append((ref, paths[ref]))
    while frontier:
        name, path = frontier.pop(0)
        for node in library[name].node_def:
            for ref in _func_refs(node):
                if ref in library and ref not in paths:
                    paths[ref] = (*path, name)
                    frontier.append((ref, paths[ref]))

    findings = [
        Finding(n.op, n.name, None, where, (), PYTHON_OP_TYPES.get(n.op, "flagged op type"))
        for n in graph_def.node
        if n.op in flagged
    ]
    # Unreachable library functions are audited too: they are shipped with the graph.
    for name, fdef in library.items():
        for n in fdef.node_def:
            if n.op in flagged:
                findings.append(
                    Finding(
                        n.op,
                        n.name,
                        name,
                        where,
                        paths.get(name, ()),
                        PYTHON_OP_TYPES.get(n.op, "flagged op type"),
                    )
                )
    return findings


# --------------------------------------------------------------------------------- datasets


def python_ops_in_dataset(dataset: tf.data.Dataset) -> list[Finding]:
    """Findings in a dataset's graph, nested functions included.

    Example::

        ds = tf.data.Dataset.range(4).map(lambda x: tf.py_function(lambda v: v, [x], tf.int64))
        python_ops_in_dataset(ds)[0].op_type   # 'EagerPyFunc'
    """
    # IGNORE: the reservoir's variables are external state by design; we only read op types.
    serialized = dataset._as_serialized_graph(
        external_state_policy=tf.data.experimental.ExternalStatePolicy.IGNORE
    )
    graph_def = tf.compat.v1.GraphDef.FromString(serialized.numpy())
    return python_ops_in_graph_def(graph_def, "dataset")


# --------------------------------------------------------------------------------- models


def _is_tf_function(obj: Any) -> bool:
    return callable(getattr(obj, "experimental_get_tracing_count", None)) and callable(
        getattr(obj, "get_concrete_function", None)
    )


def _reachable_tf_functions(root: Any, depth: int = 10) -> list[Any]:
    """``tf.function`` objects reachable from ``root`` through closures and ``__wrapped__``.

    Keras 3 builds ``model.train_function`` as a plain Python closure around the
    ``tf.function``s it traces; this finds them without depending on their names.
    """
    found: list[Any] = []
    seen: set[int] = set()

    def visit(obj: Any, d: int) -> None:
        if obj is None or id(obj) in seen or d < 0:
            return
        seen.add(id(obj))
        if _is_tf_function(obj):
            found.append(obj)
            visit(getattr(obj, "python_function", None), d - 1)
            return
        visit(getattr(obj, "__wrapped__", None), d - 1)
        for cell in getattr(obj, "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:  # empty cell
                continue
            if callable(value):
                visit(value, d - 1)

    visit(root, depth)
    return found


def step_functions(model: Any, step: str = "train") -> list[Any]:
    """The ``tf.function`` objects behind ``model.{step}_function`` (outermost first).

    Empty when the step has not been built yet or the model runs eagerly.
    """
    if step not in _STEPS:
        raise ValueError(f"step={step!r}; expected one of {_STEPS}")
    return _reachable_tf_functions(getattr(model, f"{step}_function", None))


def tracing_counts(model: Any, step: str = "train") -> dict[str, int]:
    """How many times each ``tf.function`` of a model's step was traced.

    A fixed-shape pipeline traces each once; more means retracing (a new input shape or
    dtype, or Python values changing between calls).

    Example::

        model.fit(ds, epochs=2)
        tracing_counts(model)   # {'multi_step_on_iterator': 1, 'one_step_on_data': 1}
    """
    counts: dict[str, int] = {}
    for fn in step_functions(model, step):
        name = getattr(getattr(fn, "python_function", None), "__name__", None) or repr(fn)
        counts[name] = counts.get(name, 0) + int(fn.experimental_get_tracing_count())
    return counts


def _concrete_functions(fn: Any) -> list[Any]:
    lister = getattr(fn, "_list_all_concrete_functions", None)
    return list(lister()) if callable(lister) else []


def _trace_step(model: Any, step: str, dataset: tf.data.Dataset) -> None:
    """Trace (without running) the outermost step function on ``dataset``'s element spec."""
    fns = step_functions(model, step)
    if not fns:
        return
    strategy = model.distribute_strategy
    build = getattr(model, "_symbolic_build", None)
    if callable(build):
        # Build what fit builds before its first trace (layers, loss and metric state, the
        # optimizer's slots), as fit does: created inside this trace instead, that state
        # would be traced as placeholders and the first real step would fail with "You must
        # feed a value for placeholder tensor '.../cond/Placeholder'".
        with strategy.scope():
            build(data_batch=dataset.element_spec)
    dist = strategy.experimental_distribute_dataset(dataset)
    iterator = iter(dist)
    if step == "predict":
        fns[0].get_concrete_function([next(iterator)])
    else:
        fns[0].get_concrete_function(iterator)


def python_ops_in_model(
    model: Any,
    *,
    dataset: tf.data.Dataset | None = None,
    steps: Sequence[str] = ("train",),
) -> list[Finding]:
    """Findings in the traced step functions of a compiled Keras model.

    The audit reads what has been traced. If a step has not been traced yet (no ``fit`` /
    ``predict`` call so far) pass ``dataset`` (the batched training dataset): the step
    function is traced on it, nothing is executed and no weight changes; a later ``fit`` on
    the same dataset reuses that trace. A model compiled with ``run_eagerly=True`` runs its
    steps in Python and is reported as such.

    Raises:
        ValueError: a step has no traced function and no ``dataset`` was given.
    """
    if getattr(model, "run_eagerly", False):
        return [
            Finding(
                "run_eagerly",
                "model",
                None,
                f"{s} step",
                (),
                "the model runs its steps in Python (compile(run_eagerly=False))",
            )
            for s in steps
        ]
    findings: list[Finding] = []
    for step in steps:
        if step not in _STEPS:
            raise ValueError(f"step={step!r}; expected one of {_STEPS}")
        if getattr(model, f"{step}_function", None) is None:
            getattr(model, f"make_{step}_function")()
        fns = step_functions(model, step)
        concrete = [c for f in fns for c in _concrete_functions(f)]
        if not concrete and dataset is not None:
            _trace_step(model, step, dataset)
            concrete = [c for f in fns for c in _concrete_functions(f)]
        if not concrete:
            raise ValueError(
                f"the {step} step of {type(model).__name__} has not been traced yet; run it "
                f"once or pass dataset= to python_ops_in_model to trace it"
            )
        by_name: dict[str, Any] = {}
        for c in concrete:
            by_name.setdefault(c.name.decode() if isinstance(c.name, bytes) else c.name, c)
        for name, c in by_name.items():
            for f in python_ops_in_graph_def(c.graph.as_graph_def(), f"{step} step"):
                if f.function is None:  # the node sits in the traced function itself
                    f = Finding(f.op_type, f.node, name, f.where, (), f.reason)
                findings.append(f)
    return _dedupe(findings)


def _dedupe(findings: Iterable[Finding]) -> list[Finding]:
    seen: dict[tuple[str, str, str | None, str], Finding] = {}
    for f in findings:
        seen.setdefault((f.op_type, f.node, f.function, f.where), f)
    return list(seen.values())


def assert_no_python_ops(
    dataset: tf.data.Dataset | None = None,
    model: Any = None,
    *,
    steps: Sequence[str] = ("train",),
) -> None:
    """Raise :class:`PythonInGraphError` if the dataset or the model's steps call Python.

    With both arguments, the model's steps are traced on ``dataset`` when needed (see
    :func:`python_ops_in_model`).

    Example::

        assert_no_python_ops(dataset=ds, model=model)
    """
    if dataset is None and model is None:
        raise ValueError("pass dataset=, model= or both")
    findings: list[Finding] = []
    if dataset is not None:
        findings += python_ops_in_dataset(dataset)
    if model is not None:
        findings += python_ops_in_model(model, dataset=dataset, steps=steps)
    if findings:
        raise PythonInGraphError(findings)
    log.debug(
        "audit: no Python ops found (dataset=%s, model=%s)", dataset is not None, model is not None
    )
