"""Pod list pages decoded by msgspec against the types shape.POD checks: the page parsers' fast path.

Why: on 150,000 pods the page parsers (pageparse.py) spent ~35 ms of CPU on each 3.5 MiB page,
~25 of them in the stdlib's json building every object of every pod (managedFields, volumes,
env...) only for slim.PodCompactor to keep a skeleton of each. msgspec, the field's library for
schema-directed JSON decoding, decodes only the fields shape.POD names, into types made from
that schema (so it checks what shape checks), and skips the rest without building it: ~5 ms a
page, ~15 ms with the skeletons built (bench pages). The reduced items are exactly what the stdlib path gives (tests/kubectl/test_typedpods.py
compares both on realistic and hostile pages):

- a steady pod (slim._steady, read from the typed fields) becomes PodCompactor.skeleton of the
  same values; any other pod is decoded by the stdlib from its own bytes and reduced by the
  stdlib path's own `each` (it is the one a verdict may be about: kept whole, slimmed);
- anything the types do not fit (a wrong type, a null element where the compactor reads one,
  NaN, a number past a double, nesting past the recursion limit, a page that is not a list
  object) declines the whole page (None): the stdlib path then parses it, and raises or
  reduces exactly as it always has. msgspec is never looser than shape: a field shape checks
  has a type here at least as strict, and duplicate keys count last-wins in both.

Without msgspec (an install without it, a platform with no wheel) `available` is False and the
stdlib path does everything, only slower.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Union

from . import shape, slim

try:
    import msgspec
except ImportError:  # the stdlib path parses every page
    msgspec = None

available = msgspec is not None


def _types() -> tuple[Any, Any]:
    """(decoder of a pod list page, decoder of its items as raw bytes), the pod's types made
    from shape.POD: a struct per object with the member names as attributes, every field
    optional. Absent reads as None, like dict.get, except where the compactor tells absent
    from null (`presence`: UNSET); OBJ is an empty struct (an object is checked to be one, its
    members skipped, never built)."""
    unset = msgspec.UNSET
    qty = Union[str, int, float]  # resource.Quantity as shape._is takes it (a bool is not)
    count = [0]

    class Empty(msgspec.Struct, gc=False):
        pass

    # the values the compactor keeps whole, built as they are: a container's resources (they
    # may carry members shape does not name, e.g. DRA `claims`; checked with shape._bad
    # below) and the pod's resourceClaims (a list of objects or nulls, as shape's [OBJ])
    whole = {id(shape.RESOURCES): Dict[str, Any],
             id(shape.POD["spec"]["resourceClaims"]): List[Optional[Dict[str, Any]]]}
    presence = {id(shape.POD["spec"]): slim.SKELETON_SPEC, id(shape.STATE): ("running",)}

    def typ(schema: Any) -> Any:
        if id(schema) in whole:
            return whole[id(schema)]
        if type(schema) is dict:
            told = presence.get(id(schema), ())
            fields = [(k, Union[typ(sub), None, msgspec.UnsetType], unset) if k in told
                      else (k, Optional[typ(sub)], None) for k, sub in schema.items()]
            count[0] += 1
            return msgspec.defstruct(f"Typed{count[0]}", fields, gc=False)
        if type(schema) is list:     # a null in a list of objects is a misfit (shape._bad)
            sub = typ(schema[0])
            return List[sub] if type(schema[0]) is dict else List[Optional[sub]]
        if type(schema) is set:          # {QTY}: a map of quantities
            return Dict[str, qty]
        if schema is shape.STRMAP:
            return Dict[str, str]
        return {shape.STR: str, shape.INT: int, shape.BOOL: bool, shape.QTY: qty,
                shape.OBJ: Empty}[schema]

    pod = typ(shape.POD)

    # items null, not an array, or an item not an object: declined (the stdlib decides)
    page = msgspec.defstruct("TypedPage", [("items", List[pod], []), ("metadata", Any, None)],
                             gc=False)
    raw_page = msgspec.defstruct("RawPage", [("items", List[msgspec.Raw], [])], gc=False)
    return msgspec.json.Decoder(page), msgspec.json.Decoder(raw_page)


_decoders: tuple[Any, Any] | None = None


class _Declined(Exception):
    """The stdlib path reads this page differently: it parses it."""


def parse(raw: bytes, each: Callable[[dict], Any],
          compactor: "slim.PodCompactor") -> tuple[list, str | None] | None:
    """(reduced items, continue token) of a pod list page, as pageparse.parse_page(raw, each)
    gives them, where `each` is shape.checking(compactor, POD's id); None where the page is
    not one this path decodes (the caller parses it with the stdlib)."""
    global _decoders
    if msgspec is None:
        return None
    if _decoders is None:
        _decoders = _types()
    page_dec, raw_dec = _decoders
    if not raw.isascii():
        try:  # the stdlib decodes the whole page first: a bad byte anywhere is not JSON
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
    try:
        page = page_dec.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return None
    md = page.metadata
    t = md.get("continue") if type(md) is dict else None
    token = t if isinstance(t, str) and t else None
    out: list = []
    raws = None
    try:
        for i, p in enumerate(page.items):
            got = _skeleton(p, compactor)
            if got is None:  # not steady: the stdlib's own reduction of its own parse
                if raws is None:  # the items' bytes, once a page has such a pod
                    raws = raw_dec.decode(raw).items
                got = each(slim.DECODER.decode(bytes(raws[i]).decode()))
            out.append(got)
    except _Declined:
        return None
    return out, token


def _skeleton(p: Any, comp: "slim.PodCompactor") -> Any:
    """The compactor's skeleton of typed pod `p` when it is steady (slim._steady), None when
    it is not; _Declined where the stdlib path would read it differently (a null element the
    compactor calls .get on: that path raises, this one must not decide)."""
    unset = msgspec.UNSET
    md, spec, st = p.metadata, p.spec, p.status
    # slim._steady, field by field (a missing or null object reads as {})
    if st is None or st.phase != "Running" or spec is None or not spec.nodeName:
        return None
    if md is not None:
        if md.deletionTimestamp:
            return None
        ann = md.annotations
        for k in ann or ():
            if "hami.io" in k or "nvidia.com" in k:
                return None
    statuses = st.containerStatuses
    if not statuses:
        return None
    for c in statuses:
        if c is None:
            raise _Declined
        if not (c.ready and not c.restartCount and c.state is not None
                and c.state.running is not unset):
            return None
    containers = []
    for key, cs in (("containers", spec.containers), ("initContainers", spec.initContainers)):
        kept = []
        for c in cs or ():
            if c is None:
                raise _Declined
            kept.append((c.name, c.resources))
        containers.append((key, kept))
    spec_kept = [(key, v) for key in slim.SKELETON_SPEC
                 if (v := getattr(spec, key)) is not unset]
    statuses_kept: Any = ()
    if comp.container_ids:
        statuses_kept = [(key, [(c.name, c.containerID) for c in cs or () if c is not None])
                         for key, cs in (("initContainerStatuses", st.initContainerStatuses),
                                         ("containerStatuses", statuses))]
    if md is None:
        return comp.skeleton(None, None, None, None, None, None, None, spec.nodeName,
                             containers, spec_kept, st.phase, st.qosClass, statuses_kept,
                             _check_resources)
    owners = md.ownerReferences
    return comp.skeleton(md.name, md.namespace, md.uid, md.creationTimestamp, md.labels, ann,
                         [(o.kind, o.name, o.controller) for o in owners if o is not None]
                         if owners else None,
                         spec.nodeName, containers, spec_kept, st.phase, st.qosClass,
                         statuses_kept, _check_resources)


def _check_resources(pairs: list) -> None:
    """Each container's resources as shape checks them: typed only as a map (they are kept
    whole, members shape does not name included), so checked here, once per distinct list
    (the compactor calls this only for containers it has not shared yet)."""
    for _, res in pairs:
        if shape._bad(res, shape.RESOURCES) is not None:
            raise _Declined  # the stdlib path says which field, as it always has
