"""A partitioned op in a jax.export program: a custom call that the compiling process partitions by its planner.

Under Auto mesh axes an op is a ``jax.experimental.custom_partitioning`` call (_partition.py). Its lowering
names the partition callback by the id of a Python object of the lowering process, which ``jax.export``
cannot serialize ("serialization of host_callbacks is not yet implemented"). When the lowering is for export
(``LoweringParameters.for_export``) and spans several devices, the op lowers instead to a custom call to
TARGET that carries the same Shardy sharding rule, with a backend config (JSON) naming the op, its static
arguments, the mesh axes and the platforms. Propagation reads the rule when the program is compiled, in the
exporting process or in one that reloaded it, exactly as for the live op; then XLA's SPMD partitioner calls
TARGET's partitioner, registered by `install` (on the first op's definition), which decodes the config and
hands the op to JAX's own
custom_partitioning partition callback with the op's `partition` function. So an exported program runs the
same planner, per-shard body and collectives as the live one (tests/multigpu/test_export_sharded.py compares
their compiled HLO). The live program, one device, a fully manual shard_map and Explicit mesh axes (where the
op is already a shard_map, with no callback) lower as before.

The reloading process needs TARGET's partitioner and the ops' FFI handlers: ``jax_aiter.register()`` installs
both, and so does the hook JAX calls for an installed jax-aiter (jax_aiter/_jax_plugin.py) when it lowers a
deserialized program that calls them.

This uses JAX internals (the custom_partitioning primitive's lowering rule and partition callback, which
``jax.experimental.custom_partitioning`` itself registers the same way): jax-aiter declares the JAX range it is
tested on (an upper bound in its `jax` requirement, docs/ci.md "JAX versions"), and passes a private
constructor's arguments by name (_callback_info): their number and order change between releases.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import inspect
import json
import math
import typing
from collections.abc import Callable
from functools import partial
from types import SimpleNamespace
from typing import Any

import jax
import numpy as np
from jax._src import config as jax_config
from jax._src import custom_partitioning as jax_cp
from jax._src import sharding_impls, tree_util, xla_bridge
from jax._src.interpreters import mlir
from jax._src.lib import xla_client
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import hlo
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jax_aiter import op_table

# The custom call an exported partitioned op becomes (jax_aiter.disabled_checks() names it for jax.export).
TARGET = "ja_partitioned"

# op name -> (the op's per-shard function, its custom_partitioning `partition` callback); and partition -> name
_OPS: dict[str, tuple[Callable, Callable]] = {}
_NAMES: dict[Callable, str] = {}


class ExportError(ValueError):
    """A partitioned op that cannot be exported in this context; the message names the op and the way out."""


def declare(fn: Callable, partition: Callable) -> None:
    """Record one partitioned op (called by _partition.partitioned): `fn` is the function its custom_partitioning
    wraps, whose module and name identify the op in an exported program; `partition` its partition callback."""
    name = f"{fn.__module__}.{fn.__qualname__}"
    _OPS[name] = (fn, partition)
    _NAMES[partition] = name
    install()


# --- the static arguments, as JSON -------------------------------------------------------------------------

def _static_types(fn: Callable, n: int) -> list[Any]:
    """The annotation of each of fn's first n parameters where it is a dataclass (attention's Config), else None."""
    hints = typing.get_type_hints(fn)
    params = list(inspect.signature(fn).parameters)[:n]
    return [hints.get(p) if dataclasses.is_dataclass(hints.get(p)) else None for p in params]


def _encode_static(name: str, static: tuple) -> list:
    """The static arguments as JSON values (a dataclass as its fields), checked to decode to the same values."""
    encoded = [dataclasses.asdict(s) if dataclasses.is_dataclass(s) else s for s in static]
    try:
        back = _decode_static(name, json.loads(json.dumps(encoded)))
    except (TypeError, ValueError) as e:
        back = e
    if back != tuple(static):
        raise ExportError(f"jax_aiter: {name}'s static arguments {static!r} do not survive serialization to JSON "
                          f"({back!r}); a static argument must be a bool, int, float, str or a dataclass of them "
                          "named in the function's annotation")
    return encoded


def _decode_static(name: str, values: list) -> tuple:
    types = _static_types(_OPS[name][0], len(values))
    return tuple(t(**v) if t is not None else v for t, v in zip(types, values))


# --- lowering for export -----------------------------------------------------------------------------------

def _mesh_of(ctx, op: str) -> Mesh | None:
    """The mesh an exported call of `op` is partitioned over, or None where JAX's own lowering applies."""
    axis_context = ctx.module_context.axis_context
    if isinstance(axis_context, sharding_impls.SPMDAxisContext):
        if set(axis_context.manual_axes) == set(axis_context.mesh.axis_names):
            return None  # inside a fully manual shard_map: the plain call
        raise ExportError(
            f"jax_aiter: cannot export {op} inside a jax.shard_map that leaves mesh axes "
            f"{sorted(set(axis_context.mesh.axis_names) - set(axis_context.manual_axes))} automatic: make the "
            "shard_map manual over every axis, or call the op outside it (jit with NamedSharding inputs, or "
            "inside jax.set_mesh with Explicit axes), both of which export")
    if not isinstance(axis_context, sharding_impls.ShardingContext):
        return None
    devices = axis_context.device_assignment
    if devices is None or len(devices) <= 1:
        return None  # one device: the plain call
    mesh = axis_context.abstract_mesh
    if mesh is None:
        raise ExportError(
            f"jax_aiter: cannot export {op} for {len(devices)} devices without a mesh: give the program's inputs "
            "NamedSharding on a jax.sharding.Mesh (or export inside jax.set_mesh)")
    return Mesh(np.asarray(devices).reshape(mesh.axis_sizes), mesh.axis_names)


def _sharding_rule(rule, static_args, mesh, value_types, result_types):
    """The Shardy rule attribute, as JAX's custom_partitioning lowering makes it."""
    if callable(rule):
        rule = rule(*static_args, mesh, value_types, result_types)
        rule, factors = rule if isinstance(rule, (list, tuple)) and len(rule) == 2 else (rule, {})
        if isinstance(rule, str):
            rule = jax_cp.str_to_sdy_sharding_rule(rule, **factors)
    return jax_cp.sdy_sharding_rule_to_mlir(rule, value_types, result_types)


def _exported_call(ctx, values, *, name, mesh, call, in_tree, out_tree, sharding_rule, static_args):
    """The op as a TARGET custom call: the operands, the results, the sharding rule, and the config."""
    n_args = len(call.in_avals)
    if in_tree != tree_util.tree_structure((0,) * n_args):
        raise ExportError(f"jax_aiter: {name} takes a nested structure of arrays; an exported op takes a flat list")
    leaf = tree_util.treedef_is_leaf(out_tree)
    if not leaf and out_tree != tree_util.tree_structure((0,) * out_tree.num_leaves):
        raise ExportError(f"jax_aiter: {name} returns a nested structure; an exported op returns an array or a tuple")
    config = {"op": name, "static": _encode_static(name, static_args), "axes": list(mesh.axis_names),
              "sizes": [int(s) for s in mesh.devices.shape], "operands": n_args,
              "results": None if leaf else out_tree.num_leaves, "platforms": list(ctx.module_context.platforms)}
    module_ctx = ctx.module_context
    result_types, _ = mlir.ir_tree_registry.flatten([mlir.aval_to_ir_types(module_ctx, a) for a in call.out_avals])
    value_types, _ = mlir.ir_tree_registry.flatten([mlir.aval_to_ir_types(module_ctx, a) for a in call.in_avals])
    op = hlo.CustomCallOp(result_types, list(values), call_target_name=ir.StringAttr.get(TARGET),
                          has_side_effect=ir.BoolAttr.get(False), api_version=mlir.i32_attr(2),
                          called_computations=ir.ArrayAttr.get([]),
                          backend_config=ir.StringAttr.get(json.dumps(config, sort_keys=True, separators=(",", ":"))),
                          operand_layouts=None, result_layouts=None)
    if sharding_rule is not None:
        op.attributes["sdy.sharding_rule"] = _sharding_rule(sharding_rule, static_args, mesh, value_types,
                                                            result_types)
    return op.results


def _lowering(jax_rule: Callable) -> Callable:
    """custom_partitioning's lowering rule, with this package's ops lowered to TARGET when exported."""
    def rule(ctx, *values, **params):
        name = _NAMES.get(params["partition"])
        if name is None or not ctx.module_context.lowering_parameters.for_export:
            return jax_rule(ctx, *values, **params)
        mesh = _mesh_of(ctx, name)
        if mesh is None or not jax_config.use_shardy_partitioner.value:
            return jax_rule(ctx, *values, **params)  # the plain call; or GSPMD, which JAX refuses clearly
        return _exported_call(ctx, values, name=name, mesh=mesh, call=params["call"], in_tree=params["in_tree"],
                              out_tree=params["out_tree"], sharding_rule=params["sharding_rule"],
                              static_args=params["static_args"])
    rule.jax_aiter_wraps = jax_rule  # type: ignore[attr-defined]
    return rule


# --- partitioning in the compiling process -----------------------------------------------------------------

def _op_named(name: str) -> Callable:
    """The partition callback of op `name`, importing the op modules (the op table's, only those) on first use."""
    if name not in _OPS:
        for module in sorted(set(op_table.public_api(op_table.load()).values())):
            importlib.import_module(module)
    if name not in _OPS:
        raise ExportError(f"jax_aiter: the program was exported with an op {name!r} that this jax-aiter does not "
                          "have; run it with the jax-aiter it was exported with")
    return _OPS[name][1]


@functools.cache
def _info(backend_config: bytes):
    """JAX's custom_partitioning callback record for one exported call, rebuilt from its config (and entered
    in JAX's table under that config, where JAX's partition callback looks it up; the cache keeps it alive)."""
    config = json.loads(backend_config)
    name = config["op"]
    partition = _op_named(name)
    n = math.prod(config["sizes"])
    # The per-shard body is lowered for one platform, the one compiling: the program's, or for a program exported
    # for several, the default backend's (the callback is not told which; the bodies lower alike on each).
    platforms = config["platforms"]
    platform = platforms[0] if len(platforms) == 1 or xla_bridge.default_backend() not in platforms else \
        xla_bridge.default_backend()
    devices = jax.devices(platform)
    if len(devices) < n:
        raise ExportError(f"jax_aiter: {name} was exported for {n} devices; this process has {len(devices)}")
    # The partition callback sees device positions, not identities: the mesh of the exporting lowering was its
    # device assignment in order (as here), and every sharding the partitioner passes is relative to it.
    mesh = Mesh(np.asarray(devices[:n]).reshape(config["sizes"]), tuple(config["axes"]))

    def to_mesh_pspec_sharding(hlo_sharding, ndim):
        if hlo_sharding is None:
            return None
        spec = sharding_impls.parse_flatten_op_sharding(hlo_sharding, mesh)[0]
        return NamedSharding(mesh, P(*spec, *((None,) * (ndim - len(spec)))))

    results = config["results"]
    info = _callback_info(
        partition=partition, to_mesh_pspec_sharding=to_mesh_pspec_sharding,
        in_tree=tree_util.tree_structure((0,) * config["operands"]),
        out_tree=tree_util.tree_structure(0 if results is None else (0,) * results),
        module_context=SimpleNamespace(platforms=(platform,), backend=None), mesh=mesh,
        static_args=_decode_static(name, config["static"]),
        propagate_user_sharding=None, infer_sharding_from_operands=None)
    jax_cp._sharding_callbacks[backend_config] = info
    return info


def _callback_info(**fields: Any) -> Any:
    """JAX's private custom_partitioning callback record, its fields passed by name: the constructor's parameters
    change between releases (JAX 0.11 takes nine, with GSPMD's propagate_user_sharding and
    infer_sharding_from_operands; 0.12 dropped those two), so no position is assumed. A field this JAX does not
    take is left out only where it is None (the GSPMD callbacks: an exported op is partitioned by Shardy alone);
    a parameter jax-aiter does not know is refused, naming it, the JAX version and the range tested."""
    params = inspect.signature(jax_cp._ShardingCallbackInfo).parameters
    unknown = [p for p, v in params.items() if p not in fields and v.default is inspect.Parameter.empty
               and v.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    dropped = [f for f, v in fields.items() if f not in params and v is not None]
    if unknown or dropped:
        raise ExportError(
            f"jax_aiter: JAX {jax.__version__}'s custom_partitioning callback record "
            f"(jax._src.custom_partitioning._ShardingCallbackInfo) {'takes ' + str(unknown) if unknown else ''}"
            f"{' and ' if unknown and dropped else ''}{'no longer takes ' + str(dropped) if dropped else ''}, "
            "which this jax-aiter does not know, so an exported sharded program cannot be partitioned; install a "
            f"JAX in the range jax-aiter declares and is tested on ({_declared_jax()})")
    return jax_cp._ShardingCallbackInfo(**{f: v for f, v in fields.items() if f in params})


def _declared_jax() -> str:
    """The installed jax-aiter's `jax` requirement (pyproject.toml's, through the package metadata)."""
    try:
        reqs = importlib.metadata.requires("jax-aiter") or []
    except importlib.metadata.PackageNotFoundError:
        reqs = []
    return next((r for r in reqs if r.split(";")[0].replace(" ", "").startswith(("jax<", "jax>", "jax=", "jax!"))),
                "pyproject.toml's `jax` requirement")


def _with_info(jax_callback: Callable) -> Callable:
    def callback(*args):
        _info(args[-1])  # the last argument is the custom call's backend config
        return jax_callback(*args)
    return callback


def _no_gspmd(*args):
    raise NotImplementedError(f"jax_aiter: {TARGET} (an exported jax_aiter op) is partitioned with the Shardy "
                              "partitioner only; enable it (jax_use_shardy_partitioner=True, JAX's default)")


@functools.cache
def install() -> None:
    """Lower this package's partitioned ops to TARGET when exporting, and register TARGET's partitioner (with
    XLA, and with the GPU plugins as they start, as custom_partitioning does). Once per process."""
    entry = mlir._lowerings[jax_cp.custom_partitioning_p]
    if not hasattr(entry.rule, "jax_aiter_wraps"):
        mlir.register_lowering(jax_cp.custom_partitioning_p, _lowering(entry.rule), inline=entry.inline)
    register = partial(xla_client.register_custom_call_partitioner, name=TARGET,
                       prop_user_sharding=_with_info(jax_cp._custom_partitioning_propagate_user_sharding),
                       partition=_with_info(jax_cp._custom_partitioning_partition),
                       infer_sharding_from_operands=_no_gspmd, can_side_effecting_have_replicated_sharding=True)
    register()
    xla_bridge.register_plugin_callbacks(register)
