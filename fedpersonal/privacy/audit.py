"""Audit of a federated computation: does anything derived only from private values reach the server?

`audit_private_dataflow(computation, private_parameter_index)` runs an abstract
interpretation (taint analysis) of the computation's TFF building blocks.
Values carry a set of labels: `private` for the leaves of the designated
parameter (e.g. FURL's CLIENTS-placed private states), `other` for every other
parameter. Labels flow:

* through the federated lambda calculus (references, selections, structs,
  blocks, lambdas, and every intrinsic), and
* through each compiled TensorFlow computation, by dependency analysis of its
  GraphDef: data edges, function calls (descending into the function library),
  and resource variables (a value assigned to a variable taints every read of
  it; flow-insensitive, so conservative).

A **violation** is a value whose labels are exactly `{private}` -- derived only
from private values -- that is the argument of a SERVER-producing intrinsic
(`federated_sum`, `federated_mean`, `federated_aggregate`, secure sums, ...)
or part of the computation's SERVER-placed result. Updates of global
parameters legitimately depend on private values *and* on global parameters
and data, so they are not violations.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.core.impl.compiler import building_blocks
from tensorflow_federated.python.tensorflow_libs import serialization_utils

PRIVATE = 'private'
OTHER = 'other'
Taint = frozenset

_SERVER_AGGREGATIONS = {
    'federated_aggregate',
    'federated_mean',
    'federated_weighted_mean',
    'federated_sum',
    'federated_secure_sum',
    'federated_secure_sum_bitwidth',
    'federated_secure_modular_sum',
    'federated_min',
    'federated_max',
    'federated_secure_select',
}
_PASS_THROUGH = {
    'federated_broadcast',
    'federated_value_at_server',
    'federated_value_at_clients',
    'federated_zip_at_server',
    'federated_zip_at_clients',
}
_MAPS = {'federated_map', 'federated_map_all_equal', 'federated_apply'}
_EVALS = {'federated_eval_at_server', 'federated_eval_at_clients'}


@dataclasses.dataclass(frozen=True)
class Violation:
    """A private-only value reaching the server."""

    where: str
    detail: str


# ---------------------------------------------------------------- taint trees
class _Struct(list):
    """Taint of a struct: a list of child taints."""


def _union(tree: Any) -> Taint:
    if isinstance(tree, Taint):
        return tree
    if isinstance(tree, _Struct):
        out: Taint = frozenset()
        for child in tree:
            out |= _union(child)
        return out
    return frozenset()  # Functions carry no data.


def _private_only_leaves(tree: Any) -> bool:
    if isinstance(tree, Taint):
        return tree == frozenset({PRIVATE})
    if isinstance(tree, _Struct):
        return any(_private_only_leaves(child) for child in tree)
    return False


def _taint_like(type_spec: tff.Type, label: Taint) -> Any:
    if isinstance(type_spec, tff.FederatedType):
        return _taint_like(type_spec.member, label)
    if isinstance(type_spec, tff.StructType):
        return _Struct(_taint_like(t, label) for _, t in tff.structure.iter_elements(type_spec))
    return label


# ---------------------------------------------------------- TensorFlow graphs
def _node_name(ref: str) -> str:
    return ref.lstrip('^').split(':')[0]


class _GraphAnalysis:
    """Label propagation through a GraphDef, its function library and resource variables."""

    _FUNC_CALLS = {'PartitionedCall', 'StatefulPartitionedCall'}

    def __init__(self, graph_def):
        self.graph_def = graph_def
        self.functions = {f.signature.name: f for f in graph_def.library.function}
        self.resource_taint: dict[str, Taint] = {}
        self._resource_args: dict[str, set[str]] = {}

    def _bump(self, key: str, taint: Taint) -> bool:
        old = self.resource_taint.get(key, frozenset())
        if not taint <= old:
            self.resource_taint[key] = old | taint
            return True
        return False

    def _body(self, nodes, arg_taints: dict[str, Taint], arg_resources: dict[str, str], scope: str):
        """Returns (node taints, node resource keys); updates resource taints. Fixpoint over the body."""
        taints: dict[str, Taint] = dict(arg_taints)
        resources: dict[str, str] = dict(arg_resources)
        for _ in range(20):
            changed = False
            for node in nodes:
                inputs = [i for i in node.input if not i.startswith('^')]
                in_taints, in_resources = [], []
                for ref in inputs:
                    name = _node_name(ref)
                    if name in resources:
                        in_resources.append(resources[name])
                        in_taints.append(self.resource_taint.get(resources[name], frozenset()))
                    else:
                        in_taints.append(taints.get(name, frozenset()))
                data_taint = frozenset().union(*in_taints) if in_taints else frozenset()
                if node.op in ('VarHandleOp', 'VariableV2', 'Variable'):
                    key = f'{scope}/{node.name}' if scope else node.name
                    if resources.get(node.name) != key:
                        resources[node.name] = key
                        changed = True
                    out = self.resource_taint.get(key, frozenset())
                elif node.op == 'Placeholder' and node.name in taints:
                    out = taints[node.name]
                elif node.op in self._FUNC_CALLS or node.op in self.functions:
                    fname = node.attr['f'].func.name if node.op in self._FUNC_CALLS else node.op
                    out = self._call(fname, inputs, taints, resources)
                else:
                    func_attrs = [v.func.name for v in node.attr.values() if v.func.name]
                    func_attrs += [f.name for v in node.attr.values() for f in v.list.func]
                    for fname in func_attrs:  # Loops, conditionals, dataset functions: conservative.
                        if fname in self.functions:
                            changed |= self._conservative_function_writes(fname, data_taint)
                    for key in in_resources:  # Any op touching a resource may write it.
                        changed |= self._bump(key, data_taint)
                    out = data_taint
                if taints.get(node.name) != out:
                    taints[node.name] = out
                    changed = True
            if not changed:
                break
        return taints, resources

    def _conservative_function_writes(self, fname: str, taint: Taint) -> bool:
        """Resources a control-flow/dataset function was seen to capture receive every input taint."""
        changed = False
        for key in list(self._resource_args.get(fname, ())):
            changed |= self._bump(key, taint)
        return changed

    def _call(self, fname: str, inputs: list[str], taints: dict[str, Taint], resources: dict[str, str]) -> Taint:
        function = self.functions.get(fname)
        if function is None:
            return frozenset().union(*(taints.get(_node_name(r), frozenset()) for r in inputs))
        arg_taints, arg_resources = {}, {}
        for arg, ref in zip(function.signature.input_arg, inputs):
            name = _node_name(ref)
            if name in resources:
                arg_resources[arg.name] = resources[name]
                self._resource_args.setdefault(fname, set()).add(resources[name])
            else:
                arg_taints[arg.name] = taints.get(name, frozenset())
        body_taints, _ = self._body(function.node_def, arg_taints, arg_resources, scope=fname)
        self._last_rets = {out: body_taints.get(_node_name(ref), frozenset()) for out, ref in function.ret.items()}
        self._ret_order = [a.name for a in function.signature.output_arg]
        return frozenset().union(*self._last_rets.values()) if self._last_rets else frozenset()

    def output_taints(self, input_taints: dict[str, Taint], output_names: list[str]) -> list[Taint]:
        """Taint of each `node:index` output given taints of placeholders (by node name)."""
        nodes = list(self.graph_def.node)
        for _ in range(5):  # Outer fixpoint: resource taints found in callees feed earlier readers.
            before = dict(self.resource_taint)
            taints, _ = self._body_outer(nodes, input_taints)
            if before == self.resource_taint:
                break
        return [self._tensor_taint(name, taints) for name in output_names]

    def _body_outer(self, nodes, input_taints):
        self._call_outputs: dict[str, list[Taint]] = {}
        taints: dict[str, Taint] = {}
        resources: dict[str, Any] = {}
        # Precise per-output taints for top-level calls.
        for _ in range(20):
            changed = False
            for node in nodes:
                inputs = [i for i in node.input if not i.startswith('^')]
                if node.op == 'Placeholder':
                    out = input_taints.get(node.name, frozenset())
                elif node.op in ('VarHandleOp', 'VariableV2', 'Variable'):
                    resources[node.name] = node.name
                    out = self.resource_taint.get(node.name, frozenset())
                elif node.op in self._FUNC_CALLS or node.op in self.functions:
                    fname = node.attr['f'].func.name if node.op in self._FUNC_CALLS else node.op
                    self._call(fname, inputs, taints, resources)
                    per_output = [self._last_rets.get(name, frozenset()) for name in self._ret_order]
                    if self._call_outputs.get(node.name) != per_output:
                        self._call_outputs[node.name] = per_output
                        changed = True
                    out = frozenset().union(*per_output) if per_output else frozenset()
                else:
                    in_taints = []
                    for ref in inputs:
                        src = _node_name(ref)
                        if src in resources:
                            in_taints.append(self.resource_taint.get(resources[src], frozenset()))
                        else:
                            in_taints.append(self._tensor_taint(ref, taints))
                    out = frozenset().union(*in_taints) if in_taints else frozenset()
                    for ref in inputs:
                        if _node_name(ref) in resources:
                            changed |= self._bump(resources[_node_name(ref)], out)
                if taints.get(node.name) != out:
                    taints[node.name] = out
                    changed = True
            if not changed:
                break
        return taints, resources

    def _tensor_taint(self, ref: str, taints: dict[str, Taint]) -> Taint:
        name = _node_name(ref)
        parts = ref.split(':')
        if name in getattr(self, '_call_outputs', {}) and len(parts) > 1:
            outputs = self._call_outputs[name]
            index = int(parts[-1])
            if index < len(outputs):
                return outputs[index]
        return taints.get(name, frozenset())


def _binding_names(binding) -> list:
    """Leaves of a TensorFlow binding as a tree of tensor names (sequences: their variant tensor)."""
    kind = binding.WhichOneof('binding')
    if kind == 'tensor':
        return binding.tensor.tensor_name
    if kind == 'sequence':
        return binding.sequence.variant_tensor_name
    if kind == 'struct':
        return [_binding_names(e) for e in binding.struct.element]
    return []


def _flatten_names(tree) -> list[str]:
    if isinstance(tree, str):
        return [tree]
    return [n for child in tree for n in _flatten_names(child)]


def _assign_tree(names_tree, taint_tree, out: dict[str, Taint]) -> None:
    if isinstance(names_tree, str):
        out[_node_name(names_tree)] = _union(taint_tree)
        return
    children = list(taint_tree) if isinstance(taint_tree, _Struct) else [taint_tree] * len(names_tree)
    for names, taint in zip(names_tree, children):
        _assign_tree(names, taint, out)


def _rebuild(names_tree, values: dict[str, Taint]):
    if isinstance(names_tree, str):
        return values[names_tree]
    return _Struct(_rebuild(child, values) for child in names_tree)


def _tensorflow_taint(comp: building_blocks.CompiledComputation, arg_taint: Any) -> Any:
    proto = comp.proto.tensorflow
    graph_def = serialization_utils.unpack_graph_def(proto.graph_def)
    params = _binding_names(proto.parameter) if proto.HasField('parameter') else []
    inputs: dict[str, Taint] = {}
    if proto.HasField('parameter'):
        _assign_tree(params, arg_taint, inputs)
    results = _binding_names(proto.result)
    names = _flatten_names(results)
    taints = _GraphAnalysis(graph_def).output_taints(inputs, names)
    return _rebuild(results, dict(zip(names, taints)))


# ------------------------------------------------------- federated semantics
class _Interpreter:
    def __init__(self):
        self.violations: list[Violation] = []

    def evaluate(self, comp, env: dict[str, Any]) -> Any:
        if isinstance(comp, building_blocks.Reference):
            return env[comp.name]
        if isinstance(comp, building_blocks.Selection):
            source = self.evaluate(comp.source, env)
            if isinstance(source, _Struct):
                index = comp.as_index()
                return source[index]
            return source
        if isinstance(comp, building_blocks.Struct):
            return _Struct(self.evaluate(element, env) for element in comp)
        if isinstance(comp, building_blocks.Block):
            local_env = dict(env)
            for name, value in comp.locals:
                local_env[name] = self.evaluate(value, local_env)
            return self.evaluate(comp.result, local_env)
        if isinstance(comp, building_blocks.Lambda):

            def closure(arg, comp=comp, env=env):
                inner = dict(env)
                if comp.parameter_name is not None:
                    inner[comp.parameter_name] = arg
                return self.evaluate(comp.result, inner)

            return closure
        if isinstance(comp, building_blocks.CompiledComputation):
            return lambda arg, comp=comp: _tensorflow_taint(comp, arg)
        if isinstance(comp, building_blocks.Intrinsic):
            return ('intrinsic', comp.uri)
        if isinstance(comp, building_blocks.Call):
            function = self.evaluate(comp.function, env)
            arg = self.evaluate(comp.argument, env) if comp.argument is not None else None
            if isinstance(function, tuple) and function[0] == 'intrinsic':
                return self._intrinsic(function[1], arg, comp)
            return function(arg)
        return frozenset()  # Data, Literal, Placement.

    def _intrinsic(self, uri: str, arg: Any, comp) -> Any:
        if uri in _MAPS:
            fn, value = arg[0], arg[1]
            return fn(value)
        if uri in _EVALS:
            return arg(None)
        if uri in _PASS_THROUGH:
            return arg
        if uri in _SERVER_AGGREGATIONS:
            # Aggregations with extra operands (weights, zero, bitwidth, ...) take the value first.
            with_operands = uri not in ('federated_sum', 'federated_mean', 'federated_min', 'federated_max')
            value = arg[0] if with_operands and isinstance(arg, _Struct) else arg
            if _private_only_leaves(value):
                self.violations.append(
                    Violation(
                        where=uri, detail=f'a value derived only from private inputs is aggregated at SERVER by {uri}'
                    )
                )
            return _union(value)
        return _union(arg)


def audit_private_dataflow(computation: tff.Computation, private_parameter_index: int) -> list[Violation]:
    """Returns the violations found in `computation` (empty: no private-only value reaches the server).

    Args:
      computation: A federated computation, e.g. a FURL process's `next`.
      private_parameter_index: Position of the private (CLIENTS-placed) parameter.
    """
    block = computation.to_building_block()
    parameter_type = computation.type_signature.parameter
    labels = _Struct(
        _taint_like(t, frozenset({PRIVATE}) if i == private_parameter_index else frozenset({OTHER}))
        for i, (_, t) in enumerate(tff.structure.iter_elements(parameter_type))
    )
    interpreter = _Interpreter()
    result = interpreter.evaluate(block.result, {block.parameter_name: labels})
    result_type = computation.type_signature.result
    elements = (
        list(tff.structure.iter_elements(result_type))
        if isinstance(result_type, tff.StructType)
        else [(None, result_type)]
    )
    result_children = list(result) if isinstance(result, _Struct) and len(elements) > 1 else [result]
    for (name, element_type), taint in zip(elements, result_children):
        server_placed = isinstance(element_type, tff.FederatedType) and element_type.placement is tff.SERVER
        if server_placed and _private_only_leaves(taint):
            interpreter.violations.append(
                Violation(where=f'result {name or ""}', detail='the SERVER-placed result contains a private-only value')
            )
    return interpreter.violations


def audit_tf_function(concrete_function: Any, private_inputs: Any, server_outputs: Any) -> list[Violation]:
    """The same audit on one traced TensorFlow function: is a server-bound output derived only from private inputs?

    For code that runs a round's client work outside a TFF computation, e.g. an engine worker
    (`fedpersonal.runtime.engine_workers`), which runs a process's group program and sends its results towards
    the merge: the program's private-state inputs are labelled `private`, every other input (weights, data,
    captured variables) `other`, and each of `server_outputs` must not be derived from private inputs alone.

    Args:
      concrete_function: A `tf.function`'s concrete function (``fn.get_concrete_function(...)``).
      private_inputs: The structure of its graph's input tensors that are private (e.g. the placeholders of
        the private-state argument: ``tf.nest.flatten`` of them in ``concrete_function.inputs``).
      server_outputs: The structure of its output tensors that leave the client's side.

    Returns:
      The violations (empty: nothing server-bound is derived from private inputs only).
    """
    private = {t.name for t in tf.nest.flatten(private_inputs)}
    inputs = {
        _node_name(t.name): frozenset({PRIVATE}) if t.name in private else frozenset({OTHER})
        for t in concrete_function.inputs
    }
    outputs = tf.nest.flatten(server_outputs)
    analysis = _GraphAnalysis(concrete_function.graph.as_graph_def())
    taints = analysis.output_taints(inputs, [t.name for t in outputs])
    return [
        Violation(where=f'output {t.name}', detail='a server-bound output is derived only from private inputs')
        for t, taint in zip(outputs, taints)
        if taint == frozenset({PRIVATE})
    ]


def tensor_shapes(*type_specs: tff.Type) -> set[tuple[int | None, ...]]:
    """The shapes of every tensor in `type_specs`, through structures and placements.

    A coarse complement to `audit_private_dataflow`: for example, no tensor of a
    private parameter's shape (when no global parameter shares it) may appear in
    a process's server state or metrics.
    """
    shapes = set()

    def visit(type_spec):
        if isinstance(type_spec, tff.StructType):
            for _, member in tff.structure.iter_elements(type_spec):
                visit(member)
        elif isinstance(type_spec, tff.FederatedType):
            visit(type_spec.member)
        elif isinstance(type_spec, tff.TensorType):
            shapes.add(tuple(type_spec.shape))

    for type_spec in type_specs:
        visit(type_spec)
    return shapes
